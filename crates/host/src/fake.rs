//! A scripted [`Runner`] for tests: each expected argv, in order, with the output it returns. An
//! unexpected command panics with a diff against the expected one, so a test pins the exact command lines
//! an operation issues (which is the contract with LVM and util-linux).
//!
//! ```
//! # use lvms_host::{fake::FakeRunner, runner::{Command, Runner}};
//! # tokio_test_block_on(async {
//! let fake = FakeRunner::new();
//! fake.expect(&["lvm", "vgs"]).stdout("report");
//! let out = fake.run(&Command::new("lvm", ["vgs"])).await.unwrap();
//! assert_eq!(out.stdout, "report");
//! fake.assert_done();
//! # });
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```

use std::{
    collections::VecDeque,
    fmt::Write as _,
    sync::{Arc, Mutex, MutexGuard},
};

use crate::{
    error::{Error, Result},
    runner::{Command, Output, Runner},
};

#[derive(Debug)]
enum Reply {
    Output(Output),
    Timeout,
    SpawnError,
}

#[derive(Debug)]
struct Expectation {
    argv: Vec<String>,
    reply: Reply,
}

#[derive(Debug, Default)]
struct State {
    expected: VecDeque<Expectation>,
    /// Every command run so far, for [`FakeRunner::calls`].
    calls: Vec<Command>,
}

/// A scripted runner. Clones share the same script, so a test keeps one clone and hands another to the
/// code under test.
#[derive(Debug, Clone, Default)]
pub struct FakeRunner {
    state: Arc<Mutex<State>>,
}

/// Completes one expectation: choose what the command returns.
#[must_use = "an expectation is only recorded once its reply is chosen (stdout, fails, returns, ...)"]
pub struct Expect<'a> {
    fake: &'a FakeRunner,
    argv: Vec<String>,
}

impl Expect<'_> {
    /// The command returns this output.
    pub fn returns(self, output: Output) {
        self.push(Reply::Output(output));
    }

    /// The command exits 0 with this stdout.
    pub fn stdout(self, stdout: impl Into<String>) {
        self.returns(Output::ok(stdout));
    }

    /// The command exits 0 with no output.
    pub fn succeeds(self) {
        self.returns(Output::ok(""));
    }

    /// The command exits with `code` and this stderr.
    pub fn fails(self, code: i32, stderr: impl Into<String>) {
        self.returns(Output::failed(code, stderr));
    }

    /// The command exceeds its timeout.
    pub fn times_out(self) {
        self.push(Reply::Timeout);
    }

    /// The program cannot be started.
    pub fn spawn_fails(self) {
        self.push(Reply::SpawnError);
    }

    fn push(self, reply: Reply) {
        self.fake.lock().expected.push_back(Expectation {
            argv: self.argv,
            reply,
        });
    }
}

impl FakeRunner {
    pub fn new() -> Self {
        Self::default()
    }

    /// Expects `argv` (program first) as the next command.
    pub fn expect(&self, argv: &[&str]) -> Expect<'_> {
        Expect {
            fake: self,
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// Panics unless every expected command has run.
    #[track_caller]
    pub fn assert_done(&self) {
        let state = self.lock();
        if !state.expected.is_empty() {
            let mut msg = format!(
                "FakeRunner: {} expected command(s) never ran:\n",
                state.expected.len()
            );
            for e in &state.expected {
                let _ = writeln!(msg, "  {}", crate::error::Argv(e.argv.clone()));
            }
            panic!("{msg}");
        }
    }

    /// The commands run so far.
    pub fn calls(&self) -> Vec<Command> {
        self.lock().calls.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in another test thread poisons the lock; the script is still usable for reporting.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn next(&self, cmd: &Command) -> Result<Output> {
        let actual = cmd.argv().0;
        let mut state = self.lock();
        state.calls.push(cmd.clone());
        let Some(expected) = state.expected.pop_front() else {
            drop(state);
            panic!(
                "FakeRunner: unexpected command (no more commands expected):\n  {}",
                crate::error::Argv(actual)
            );
        };
        if expected.argv != actual {
            drop(state);
            panic!("{}", diff(&expected.argv, &actual));
        }
        match expected.reply {
            Reply::Output(out) => Ok(out),
            Reply::Timeout => Err(Error::Timeout {
                argv: cmd.argv(),
                timeout: cmd.timeout,
            }),
            Reply::SpawnError => Err(Error::Spawn {
                argv: cmd.argv(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "fake: program not found",
                ),
            }),
        }
    }
}

impl Runner for FakeRunner {
    fn run(&self, cmd: &Command) -> impl Future<Output = Result<Output>> + Send {
        let result = self.next(cmd);
        std::future::ready(result)
    }
}

/// Expected and actual argv side by side, one argument a line, with the first difference marked.
fn diff(expected: &[String], actual: &[String]) -> String {
    let mut out = String::from("FakeRunner: command differs from the expected one\n");
    let _ = writeln!(out, "  expected: {}", crate::error::Argv(expected.to_vec()));
    let _ = writeln!(out, "  actual:   {}", crate::error::Argv(actual.to_vec()));
    let n = expected.len().max(actual.len());
    let mut marked = false;
    for i in 0..n {
        let e = expected.get(i).map_or("<none>", String::as_str);
        let a = actual.get(i).map_or("<none>", String::as_str);
        let mark = if e != a && !marked {
            marked = true;
            "  <== first difference"
        } else if e != a {
            "  <=="
        } else {
            ""
        };
        let _ = writeln!(out, "  [{i:2}] expected {e:<40} actual {a}{mark}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replays_outputs_in_order() {
        let fake = FakeRunner::new();
        fake.expect(&["a", "1"]).stdout("one");
        fake.expect(&["b"]).fails(5, "boom");
        let one = fake.run(&Command::new("a", ["1"])).await.unwrap();
        assert_eq!(one.stdout, "one");
        let two = fake
            .run(&Command::new("b", Vec::<String>::new()))
            .await
            .unwrap();
        assert_eq!(two.code, Some(5));
        assert_eq!(two.stderr, "boom");
        fake.assert_done();
        assert_eq!(fake.calls().len(), 2);
    }

    #[tokio::test]
    async fn scripted_timeout_and_spawn_errors_are_errors() {
        let fake = FakeRunner::new();
        fake.expect(&["slow"]).times_out();
        fake.expect(&["missing"]).spawn_fails();
        let cmd = Command::new("slow", Vec::<String>::new());
        assert!(matches!(fake.run(&cmd).await, Err(Error::Timeout { .. })));
        let cmd = Command::new("missing", Vec::<String>::new());
        assert!(matches!(fake.run(&cmd).await, Err(Error::Spawn { .. })));
    }

    #[tokio::test]
    #[should_panic(expected = "first difference")]
    async fn unexpected_argv_panics_with_a_diff() {
        let fake = FakeRunner::new();
        fake.expect(&["lvm", "lvs", "vg1"]).succeeds();
        let _ = fake.run(&Command::new("lvm", ["lvs", "vg2"])).await;
    }

    #[tokio::test]
    #[should_panic(expected = "no more commands expected")]
    async fn a_command_beyond_the_script_panics() {
        let fake = FakeRunner::new();
        let _ = fake.run(&Command::new("lvm", ["lvs"])).await;
    }

    #[test]
    #[should_panic(expected = "never ran")]
    fn assert_done_panics_on_leftover_expectations() {
        let fake = FakeRunner::new();
        fake.expect(&["lvm", "vgs"]).succeeds();
        fake.assert_done();
    }

    #[test]
    fn diff_marks_the_first_differing_argument() {
        let d = diff(
            &["lvm".into(), "lvs".into(), "vg1".into()],
            &["lvm".into(), "lvs".into(), "vg2".into(), "x".into()],
        );
        assert!(d.contains("[ 2] expected vg1"), "{d}");
        assert!(d.contains("actual vg2  <== first difference"), "{d}");
        assert!(d.contains("[ 3] expected <none>"), "{d}");
    }
}
