//! Running host programs: argv vectors only (never a shell), a timeout on every call, stdout and stderr
//! captured, each call logged at debug with its argv and exit status.

use std::{future::Future, process::Stdio, sync::Arc, time::Duration};

use crate::error::{Argv, Error, Result};

/// The timeout a [`Command`] gets unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Environment every command runs with: messages in English and the C locale's number format (LVM's
/// reports and error texts are parsed), and no LVM warnings about inherited file descriptors.
pub const COMMAND_ENV: &[(&str, &str)] = &[("LC_ALL", "C"), ("LVM_SUPPRESS_FD_WARNINGS", "1")];

/// One program invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub program: String,
    pub args: Vec<String>,
    pub timeout: Duration,
}

impl Command {
    pub fn new<P, I, S>(program: P, args: I) -> Self
    where
        P: Into<String>,
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Program and arguments as one list.
    pub fn argv(&self) -> Argv {
        Argv(
            std::iter::once(self.program.clone())
                .chain(self.args.iter().cloned())
                .collect(),
        )
    }
}

/// What a finished program left behind.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Output {
    /// Exit code; `None` when the program was killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// Exit code 0 with the given stdout.
    pub fn ok(stdout: impl Into<String>) -> Self {
        Self {
            code: Some(0),
            stdout: stdout.into(),
            stderr: String::new(),
        }
    }

    /// A failure with the given exit code and stderr.
    pub fn failed(code: i32, stderr: impl Into<String>) -> Self {
        Self {
            code: Some(code),
            stdout: String::new(),
            stderr: stderr.into(),
        }
    }

    /// The generic error for this output of `cmd`.
    pub fn into_error(self, cmd: &Command) -> Error {
        Error::CommandFailed {
            argv: cmd.argv(),
            code: self.code,
            stderr: self.stderr.trim_end().to_owned(),
        }
    }
}

/// Runs commands. `Err` only when the program could not be started or timed out; a non-zero exit is an
/// `Ok(Output)` for the caller to interpret.
pub trait Runner: Send + Sync + 'static {
    fn run(&self, cmd: &Command) -> impl Future<Output = Result<Output>> + Send;
}

impl<R: Runner> Runner for Arc<R> {
    fn run(&self, cmd: &Command) -> impl Future<Output = Result<Output>> + Send {
        (**self).run(cmd)
    }
}

impl<R: Runner> Runner for &'static R {
    fn run(&self, cmd: &Command) -> impl Future<Output = Result<Output>> + Send {
        (**self).run(cmd)
    }
}

/// Runs commands on this machine with `tokio::process`: no shell, stdin from `/dev/null`, the
/// environment of [`COMMAND_ENV`] added, killed when the timeout expires or the call is dropped.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealRunner;

impl Runner for RealRunner {
    async fn run(&self, cmd: &Command) -> Result<Output> {
        let argv = cmd.argv();
        let started = std::time::Instant::now();
        let mut child = tokio::process::Command::new(&cmd.program);
        child
            .args(&cmd.args)
            .envs(COMMAND_ENV.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // `output()` owns the child: when the timeout drops it, kill_on_drop kills the process.
        let result = tokio::time::timeout(cmd.timeout, child.output()).await;
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let out = match result {
            Err(_) => {
                tracing::warn!(%argv, timeout = ?cmd.timeout, "command timed out and was killed");
                return Err(Error::Timeout {
                    argv,
                    timeout: cmd.timeout,
                });
            }
            Ok(Err(source)) => {
                tracing::debug!(%argv, error = %source, "command could not be started");
                return Err(Error::Spawn { argv, source });
            }
            Ok(Ok(out)) => out,
        };
        let output = Output {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        if output.success() {
            tracing::debug!(%argv, code = ?output.code, elapsed_ms, "command finished");
        } else {
            tracing::debug!(
                %argv,
                code = ?output.code,
                elapsed_ms,
                stderr = %output.stderr.trim_end(),
                "command failed"
            );
        }
        Ok(output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_displays_like_a_shell_line() {
        let cmd = Command::new("mount", ["-o", "ro", "/dev/vdb", "/mnt/a b", "it's", ""]);
        assert_eq!(
            cmd.argv().to_string(),
            r"mount -o ro /dev/vdb '/mnt/a b' 'it'\''s' ''"
        );
    }

    #[tokio::test]
    async fn real_runner_captures_stdout_stderr_and_exit_code() {
        let out = RealRunner
            .run(&Command::new(
                "sh",
                ["-c", "echo out; echo err >&2; echo $LC_ALL >&2; exit 3"],
            ))
            .await
            .unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout, "out\n");
        assert_eq!(out.stderr, "err\nC\n");
        assert!(!out.success());
    }

    #[tokio::test]
    async fn real_runner_passes_arguments_verbatim_without_a_shell() {
        let out = RealRunner
            .run(&Command::new("echo", ["$HOME", "a b", ";", "|"]))
            .await
            .unwrap();
        assert!(out.success());
        assert_eq!(out.stdout, "$HOME a b ; |\n");
    }

    #[tokio::test]
    async fn real_runner_gives_stdin_as_empty() {
        let out = RealRunner
            .run(&Command::new("cat", Vec::<String>::new()))
            .await
            .unwrap();
        assert!(out.success());
        assert_eq!(out.stdout, "");
    }

    #[tokio::test]
    async fn real_runner_kills_a_command_at_its_timeout() {
        let started = std::time::Instant::now();
        let err = RealRunner
            .run(&Command::new("sleep", ["30"]).timeout(Duration::from_millis(200)))
            .await
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        match err {
            Error::Timeout { argv, timeout } => {
                assert_eq!(argv.to_string(), "sleep 30");
                assert_eq!(timeout, Duration::from_millis(200));
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn real_runner_reports_a_missing_program_as_spawn_error() {
        let err = RealRunner
            .run(&Command::new("/nonexistent/lvms-no-such-program", ["x"]))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Spawn { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains("/nonexistent/lvms-no-such-program x"),
            "{err}"
        );
    }
}
