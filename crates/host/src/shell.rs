//! [`LvmShell`]: a [`Runner`] that sends `lvm` commands to one long-lived LVM shell process instead of
//! starting a process per command: LVM's start-up (exec and dynamic linking, config parsing, device-cache
//! setup) is paid once. Thin creates ran 1.65× as fast in the test VM (100 of each, interleaved with
//! separate processes; `cargo xtask bench` measures the driver over it against raw processes; a colleague measured
//! 2.1× in the VM and ~1.15× natively).
//!
//! # The protocol (lvm2 2.03, measured in the test VM; transcripts in `tests/fixtures/real/lvm-shell-*`)
//! - The shell is `lvm` without arguments. With stdin a pipe it prints no prompt (lvm2 is built with
//!   editline, which is silent on a non-terminal) and reads one command per line.
//! - Its output format is fixed when it starts, from its configuration: per-command `--config` or
//!   `--reportformat` cannot change it (and `--config` makes LVM re-read its whole configuration twice per
//!   command). The shell is started with `LVM_COMMAND_PROFILE=lvms-shell`, a command profile setting
//!   `report/output_format = "json"`, `log/report_command_log = 1` and `log/command_log_selection = "all"`.
//!   Profiles are looked up only by name in `<LVM_SYSTEM_DIR>/profile/`, so the shell gets a private
//!   `LVM_SYSTEM_DIR` (`SystemDir`) in which every entry of the real one is a symbolic link, except
//!   `profile/`, which holds links to the real profiles plus ours: LVM reads the real `lvm.conf`,
//!   `lvmlocal.conf`, devices file, backup and archive directories, so the host's configuration keeps its
//!   meaning.
//! - Every command then prints exactly one JSON document on stdout, `  {` … `  }`: the report sections
//!   (`"report": [{"lv": [...]}]`) if it is a report command, and always a `"log"` array. The log holds the
//!   command's messages in order (`log_type` `print` for what a process prints on stdout, `error` / `warn`
//!   for stderr, `status` rows per object) and ends with the shell's own row, `log_context` `shell`,
//!   `log_type` `status`, whose `log_ret_code` is LVM's internal result: 1 is success (exit code 0),
//!   anything else is the exit code a separate process would have had (5 failed, 3 invalid command line,
//!   2 no such command).
//! - Nothing goes to stderr except what bypasses LVM's log: getopt's complaints (`lvcreate: unrecognized
//!   option '--x'`) and questions (`… Wipe it? [y/n]: `). A question waits for an answer on stdin, the
//!   same pipe the commands come from; a separate process has stdin at `/dev/null`, where LVM takes EOF as
//!   "no" and prints `[n]`. So a question is answered `n` and `[n]` is added to the stderr text.
//! - Arguments are split at whitespace by lvm2's `lvm_split`: a word starting with `'` or `"` runs to the
//!   next same quote (no escapes, and quotes elsewhere are literal); a word starting with `#` ends the line
//!   (a comment). At most 63 words per line: with 64 the shell logs "Too many arguments" and prints
//!   nothing at all.
//!
//! # Mapping to [`Output`]
//! `code` as above; `stderr` is the raw stderr text followed by every `error`/`warn` message as LVM prints
//! them (`"  <message>\n"`), so [`crate::lvm::classify`] sees the same texts; `stdout` is the JSON document
//! as printed for a report command, or the `print` messages otherwise.
//!
//! # Process handling
//! One command at a time (a tokio mutex; waiting for it counts against the command's timeout). The shell
//! is started on first use, checked with a `formats` command, and started again when it has died. A
//! command that runs past its timeout kills the shell and returns the same [`Error::Timeout`] as
//! [`RealRunner`]; a caller that drops the future mid-command kills it too (as `kill_on_drop` does for a
//! process). A shell that dies during a command gives a failed [`Output`] (the command may or may not have
//! happened; it is not retried). Commands the shell cannot take unchanged (other programs, more than 63
//! words, arguments it cannot quote, shell built-ins such as `exit`) run as separate processes through
//! [`RealRunner`], and so does everything once the shell has failed its start-up check (logged once, see
//! [`LvmShell::fallback_reason`]).
//!
//! Commands with a `--devicesfile` (those of shared classes, [`crate::shared`], which may wait for sanlock for
//! minutes) run as separate processes.
//!
//! Commands on physical volumes and devices (`pvs`, `pvcreate`, `vgcreate`, `vgextend`, …) run as separate
//! processes too, and the shell is restarted after those that change something: lvm2 keeps device sizes
//! cached in the shell until a volume-group lock is released, so a shell can see a re-attached or resized
//! device at its old size (`DEVICE_READS`). Logical-volume commands and `lvs`/`vgs`, the frequent
//! ones, lock volume groups, which makes the next command read sizes again; a device that changes size
//! while the shell ran only commands that lock no volume group (`vgs` with none) can still be seen at its
//! old size by the next one.

use std::{
    borrow::Cow,
    io,
    os::{
        fd::AsFd,
        unix::fs::{DirBuilderExt, symlink},
    },
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use serde::Deserialize;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    process::{Child, ChildStderr, ChildStdin, ChildStdout},
    sync::Mutex,
    time::Instant,
};

use crate::{
    error::{Error, Result},
    lvm::LVM,
    runner::{COMMAND_ENV, Command, Output, RealRunner, Runner},
};

/// Name of the command profile the shell runs with.
pub const SHELL_PROFILE: &str = "lvms-shell";

/// The profile: JSON output and a command log with every row (the default selection drops the shell's
/// "success" status row, which carries the result code).
const PROFILE_TEXT: &str =
    "# Written by lvms for its LVM shell process; removed when the process ends.
report {
\toutput_format = \"json\"
}
log {
\treport_command_log = 1
\tcommand_log_selection = \"all\"
}
";

/// lvm2's `MAX_ARGS` is 64, and `lvm_split` refuses a line that reaches it.
pub const MAX_WORDS: usize = 63;

/// Words the shell treats itself instead of running them as the LVM command a process would run.
const SHELL_WORDS: &[&str] = &["exit", "quit", "lastlog", "lvm"];

/// Commands that read LVM physical volumes or devices: they run as separate processes. The shell keeps a
/// device's size cached from one command to the next unless a volume-group lock was released in between
/// (lvm2 invalidates the sizes only then), so after a device was attached, re-attached or resized a shell
/// command can still see its old size: `pvcreate` of a re-attached loop device failed with "device is too
/// small (pv_min_size)" in the VM. A separate process reads every size afresh.
const DEVICE_READS: &[&str] = &["pvs", "pvdisplay", "pvck", "lvmdiskscan"];

/// Commands that change LVM physical volumes or the devices of a volume group: they run as separate
/// processes (`DEVICE_READS`), and the shell is restarted after them so that it forgets what it knew
/// about the devices. Any other command starting with `pv` counts as one of these.
const DEVICE_CHANGES: &[&str] = &[
    "vgcreate",
    "vgextend",
    "vgreduce",
    "vgsplit",
    "vgmerge",
    "vgimport",
    "vgimportclone",
    "vgimportdevices",
    "vgcfgrestore",
    "lvmdevices",
];

/// Whether `cmd` changes physical volumes or devices (and the shell must be restarted after it).
fn changes_devices(cmd: &Command) -> bool {
    let Some(first) = cmd.args.first().map(String::as_str) else {
        return false;
    };
    cmd.program == LVM
        && ((first.starts_with("pv") && !DEVICE_READS.contains(&first))
            || DEVICE_CHANGES.contains(&first))
}

/// How every LVM question ends.
const QUESTION_END: &[u8] = b"[y/n]: ";

/// The start-up check: a command that reads no metadata and takes no lock.
const PROBE: &str = "formats";

/// How long a new shell may take to answer [`PROBE`].
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// LVM's `ECMD_PROCESSED`, the shell's result code for success.
const ECMD_PROCESSED: i32 = 1;

// ---- the line ----

/// `arg` as one word for `lvm_split`, or `None` if it cannot be one. Plain when it has no whitespace and
/// does not start with a quote or `#`; otherwise in single quotes, or double quotes if it contains a single
/// quote. Only printable ASCII is sent (anything else goes to a separate process).
fn quote_arg(arg: &str) -> Option<Cow<'_, str>> {
    if !arg.bytes().all(|b| (b' '..=b'~').contains(&b)) {
        return None;
    }
    let plain = !arg.is_empty() && !arg.contains(' ') && !arg.starts_with(['\'', '"', '#']);
    if plain {
        Some(Cow::Borrowed(arg))
    } else if !arg.contains('\'') {
        Some(Cow::Owned(format!("'{arg}'")))
    } else if !arg.contains('"') {
        Some(Cow::Owned(format!("\"{arg}\"")))
    } else {
        None
    }
}

/// The line to send for `cmd` (without the newline), or why it must run as a separate process.
fn shell_line(cmd: &Command) -> std::result::Result<String, &'static str> {
    if cmd.program != LVM {
        return Err("not an lvm command");
    }
    let Some(first) = cmd.args.first() else {
        return Err("no lvm subcommand");
    };
    if first.is_empty() || !first.bytes().all(|b| b.is_ascii_lowercase()) {
        return Err("not an lvm subcommand");
    }
    if SHELL_WORDS.contains(&first.as_str()) {
        return Err("a word the lvm shell handles itself");
    }
    if DEVICE_READS.contains(&first.as_str()) || changes_devices(cmd) {
        return Err(
            "a command on physical volumes or devices, whose sizes the lvm shell may have cached",
        );
    }
    if cmd.args.iter().any(|a| a == "--devicesfile") {
        // Shared classes (crate::shared): lock-start and activations wait for sanlock, which would
        // hold up every other command queued behind the shell.
        return Err(
            "a command with its own devices file (a shared class's), which may wait for locks",
        );
    }
    if cmd.args.len() > MAX_WORDS {
        return Err("more words than the lvm shell takes on a line");
    }
    let mut line = String::new();
    for arg in &cmd.args {
        let word = quote_arg(arg).ok_or("an argument the lvm shell cannot quote")?;
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&word);
    }
    Ok(line)
}

// ---- the reply ----

/// One command's answer as the shell printed it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reply {
    /// Text on stdout before the JSON document (none seen in practice).
    preamble: String,
    /// The JSON document exactly as printed, from the start of its first line to its `}`.
    json: String,
}

#[derive(Debug, PartialEq, Eq)]
enum Scan {
    /// The reply is not complete yet.
    Incomplete,
    /// A reply, and how many bytes of the buffer it took.
    Complete(Reply, usize),
    /// Output that is not the shell's protocol.
    Invalid(String),
}

/// Looks for one complete reply at the start of `buf`: text lines, then a JSON document on the first line
/// whose first non-blank character is `{`.
fn scan(buf: &[u8]) -> Scan {
    let starts_json = |line: &[u8]| line.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let mut json_start = 0;
    loop {
        let rest = &buf[json_start..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(nl) if !starts_json(&rest[..nl]) => json_start += nl + 1,
            Some(_) => break,
            // A line still being written: look at it once it is complete, unless it is JSON already.
            None if starts_json(rest) => break,
            None => return Scan::Incomplete,
        }
    }
    let mut stream = serde_json::Deserializer::from_slice(&buf[json_start..])
        .into_iter::<serde::de::IgnoredAny>();
    match stream.next() {
        Some(Ok(_)) => {
            let json_end = json_start + stream.byte_offset();
            // The document's own line end belongs to it.
            let used = if buf.get(json_end) == Some(&b'\n') {
                json_end + 1
            } else {
                json_end
            };
            Scan::Complete(
                Reply {
                    preamble: String::from_utf8_lossy(&buf[..json_start]).into_owned(),
                    json: String::from_utf8_lossy(&buf[json_start..json_end]).into_owned(),
                },
                used,
            )
        }
        Some(Err(e)) if e.is_eof() => Scan::Incomplete,
        Some(Err(e)) => Scan::Invalid(format!("not a JSON document: {e}")),
        None => Scan::Incomplete,
    }
}

#[derive(Deserialize)]
struct Document {
    report: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    log: Vec<LogRow>,
}

#[derive(Deserialize)]
struct LogRow {
    log_type: String,
    log_context: String,
    log_message: String,
    log_ret_code: String,
}

/// The [`Output`] a separate `lvm` process would have given for `reply` (see the module documentation).
/// `raw_stderr` is what the shell wrote to stderr during the command. `Err` when the reply lacks the
/// shell's status row (the profile was not applied) or is not a log document.
fn to_output(reply: &Reply, raw_stderr: &str) -> std::result::Result<Output, String> {
    let doc: Document = serde_json::from_str(&reply.json)
        .map_err(|e| format!("not an LVM report document: {e}"))?;
    let status = doc
        .log
        .iter()
        .rev()
        .find(|r| r.log_type == "status" && r.log_context == "shell")
        .ok_or("no status row of the shell in the command log")?;
    let ret: i32 = status
        .log_ret_code
        .parse()
        .map_err(|_| format!("shell status {:?} is not a number", status.log_ret_code))?;
    let mut stderr = raw_stderr.to_owned();
    let mut printed = String::new();
    for row in &doc.log {
        let to = match row.log_type.as_str() {
            "status" => continue,
            "print" => &mut printed,
            _ => &mut stderr,
        };
        to.push_str("  ");
        to.push_str(&row.log_message);
        to.push('\n');
    }
    let stdout = if doc.report.is_some() {
        format!("{}{}\n", reply.preamble, reply.json)
    } else {
        format!("{}{printed}", reply.preamble)
    };
    Ok(Output {
        code: Some(if ret == ECMD_PROCESSED { 0 } else { ret }),
        stdout,
        stderr,
    })
}

// ---- the private LVM_SYSTEM_DIR ----

/// A private `LVM_SYSTEM_DIR` for the shell: links to every entry of the real one, and a `profile/`
/// directory with links to the real profiles plus [`SHELL_PROFILE`]. Removed on drop.
///
/// `backup/` and `archive/` are created in the real directory when missing (LVM would create them there on
/// its first metadata change; through a dangling link it could not). Entries that appear in the real
/// directory later are seen after the shell's next start.
#[derive(Debug)]
struct SystemDir {
    path: PathBuf,
}

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

impl SystemDir {
    fn create(real: &Path) -> io::Result<Self> {
        let base = std::env::temp_dir();
        let mut attempt = 0;
        let dir = loop {
            let path = base.join(format!(
                "lvms-lvm-shell-{}-{}",
                std::process::id(),
                NEXT_DIR.fetch_add(1, Ordering::Relaxed)
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => break Self { path },
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 16 => attempt += 1,
                Err(e) => return Err(e),
            }
        };
        dir.populate(real)?;
        Ok(dir)
    }

    fn populate(&self, real: &Path) -> io::Result<()> {
        let link_all = |from: &Path, to: &Path, skip: &str| -> io::Result<()> {
            let entries = match std::fs::read_dir(from) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e),
            };
            for entry in entries {
                let name = entry?.file_name();
                if name != skip {
                    symlink(from.join(&name), to.join(&name))?;
                }
            }
            Ok(())
        };
        if real.is_dir() {
            for name in ["backup", "archive"] {
                let p = real.join(name);
                if !p.exists() {
                    let _ = std::fs::DirBuilder::new().mode(0o700).create(&p);
                }
            }
        }
        link_all(real, &self.path, "profile")?;
        let profiles = self.path.join("profile");
        std::fs::create_dir(&profiles)?;
        let ours = format!("{SHELL_PROFILE}.profile");
        link_all(&real.join("profile"), &profiles, &ours)?;
        std::fs::write(profiles.join(ours), PROFILE_TEXT)
    }
}

impl Drop for SystemDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::debug!(path = %self.path.display(), error = %e, "could not remove the lvm shell's directory");
        }
    }
}

// ---- the process ----

/// One running shell.
#[derive(Debug)]
struct Session {
    child: Child,
    pid: Option<u32>,
    stdin: ChildStdin,
    stdout: ChildStdout,
    /// `None` once it reached EOF.
    stderr: Option<ChildStderr>,
    out: Vec<u8>,
    err: Vec<u8>,
}

/// How a command ended.
#[derive(Debug)]
enum Exchange {
    Reply {
        reply: Reply,
        stderr: String,
    },
    /// The shell exited (or closed stdout) before its reply was complete.
    Died {
        stdout: String,
        stderr: String,
        status: Option<ExitStatus>,
    },
}

/// A reply the shell should not give: the session cannot be trusted any more.
#[derive(Debug)]
struct ProtocolError(String);

async fn read_stderr(stderr: &mut Option<ChildStderr>, buf: &mut Vec<u8>) -> io::Result<usize> {
    match stderr {
        Some(s) => s.read_buf(buf).await,
        None => std::future::pending().await,
    }
}

impl Session {
    fn spawn(program: &Path, system_dir: &Path) -> io::Result<Self> {
        let mut child = tokio::process::Command::new(program)
            .envs(COMMAND_ENV.iter().copied())
            .env("LVM_SYSTEM_DIR", system_dir)
            .env("LVM_COMMAND_PROFILE", SHELL_PROFILE)
            // The shell keeps its command history in $HOME/.lvm_history.
            .env("HOME", system_dir)
            // These would send output to other descriptors.
            .env_remove("LVM_OUT_FD")
            .env_remove("LVM_ERR_FD")
            .env_remove("LVM_REPORT_FD")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(io::Error::other("the lvm shell's pipes are missing"));
        };
        Ok(Self {
            pid: child.id(),
            child,
            stdin,
            stdout,
            stderr: Some(stderr),
            out: Vec::new(),
            err: Vec::new(),
        })
    }

    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends one line. An error means the shell did not get it (its stdin is closed: it has exited).
    async fn send(&mut self, line: &str) -> io::Result<()> {
        self.out.clear();
        self.err.clear();
        self.stdin.write_all(format!("{line}\n").as_bytes()).await?;
        self.stdin.flush().await
    }

    /// Reads until the command's reply is complete, answering questions with "n".
    async fn receive(&mut self) -> std::result::Result<Exchange, ProtocolError> {
        let mut answered = 0;
        loop {
            let Self {
                stdout,
                stderr,
                out,
                err,
                ..
            } = self;
            let before = out.len();
            tokio::select! {
                r = stdout.read_buf(out) => match r {
                    Ok(n) if n > 0 => {
                        // LVM ends its document with a line "  }": look only then.
                        let tail = &out[before.saturating_sub(1)..];
                        if !tail.windows(2).any(|w| w == b"}\n") {
                            continue;
                        }
                        match scan(out) {
                            Scan::Incomplete => {}
                            Scan::Invalid(e) => return Err(ProtocolError(e)),
                            Scan::Complete(reply, used) => {
                                if used != out.len() {
                                    return Err(ProtocolError(format!(
                                        "unexpected output after the reply: {:?}",
                                        String::from_utf8_lossy(&out[used..])
                                    )));
                                }
                                self.drain_stderr();
                                let stderr = String::from_utf8_lossy(&self.err).into_owned();
                                return Ok(Exchange::Reply { reply, stderr });
                            }
                        }
                    }
                    _ => return Ok(self.died().await),
                },
                r = read_stderr(stderr, err) => match r {
                    Ok(n) if n > 0 => {
                        if err.len() > answered && err.ends_with(QUESTION_END) {
                            tracing::debug!(
                                question = %String::from_utf8_lossy(err).trim_end(),
                                "answering an lvm question with \"n\", as a process with stdin at /dev/null would"
                            );
                            // A failed write shows up as EOF on stdout.
                            let _ = self.stdin.write_all(b"n\n").await;
                            let _ = self.stdin.flush().await;
                            self.err.extend_from_slice(b"[n]\n");
                            answered = self.err.len();
                        }
                    }
                    _ => *stderr = None,
                },
            }
        }
    }

    /// Reads what the shell wrote to stderr before it completed its reply and is still in the pipe. LVM
    /// writes stderr before it prints the reply, so it is all there now; reading the pipe directly (it is
    /// non-blocking) does not depend on the runtime having seen it become readable.
    fn drain_stderr(&mut self) {
        let Some(stderr) = &self.stderr else { return };
        let nonblocking = rustix::fs::fcntl_getfl(stderr.as_fd())
            .is_ok_and(|f| f.contains(rustix::fs::OFlags::NONBLOCK));
        if !nonblocking {
            return;
        }
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = rustix::io::read(stderr.as_fd(), &mut buf) {
            self.err.extend_from_slice(&buf[..n]);
        }
    }

    /// The shell is gone: collect what is left of its output and its exit status.
    async fn died(&mut self) -> Exchange {
        let rest = async {
            if let Some(stderr) = &mut self.stderr {
                let _ = stderr.read_to_end(&mut self.err).await;
            }
            self.child.wait().await.ok()
        };
        let status = tokio::time::timeout(Duration::from_secs(2), rest)
            .await
            .ok()
            .flatten();
        Exchange::Died {
            stdout: String::from_utf8_lossy(&self.out).into_owned(),
            stderr: String::from_utf8_lossy(&self.err).into_owned(),
            status,
        }
    }
}

// ---- the runner ----

#[derive(Debug, Default)]
struct State {
    // Dropped first: the process goes before its directory.
    session: Option<Session>,
    system_dir: Option<SystemDir>,
    /// Why commands run as separate processes from now on.
    fallback: Option<String>,
}

/// Why a command did not get a reply.
enum Failure {
    /// The caller's timeout expired.
    Timeout,
    /// The shell could not be started (the program is missing).
    Spawn(io::Error),
    /// The shell started but does not work as expected, and the command was not sent: use separate
    /// processes from now on.
    Unusable(String),
    /// The reply to the command was not understood (the command may have run).
    Protocol(String),
}

/// A [`Runner`] that runs `lvm` commands in one long-lived LVM shell process (see the [module
/// documentation](self)) and every other command through [`RealRunner`].
#[derive(Debug)]
pub struct LvmShell {
    program: PathBuf,
    real_system_dir: PathBuf,
    state: Mutex<State>,
}

impl Default for LvmShell {
    fn default() -> Self {
        Self::new()
    }
}

impl LvmShell {
    /// A shell of the `lvm` found on `PATH`, configured from `LVM_SYSTEM_DIR` (default `/etc/lvm`). Nothing
    /// starts until the first command.
    pub fn new() -> Self {
        Self::with_program(LVM)
    }

    /// A shell of another LVM program (a path to `lvm`). Commands that cannot go through the shell run as
    /// separate processes of the same program.
    pub fn with_program(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            real_system_dir: std::env::var_os("LVM_SYSTEM_DIR")
                .map_or_else(|| PathBuf::from("/etc/lvm"), PathBuf::from),
            state: Mutex::new(State::default()),
        }
    }

    /// The LVM system directory whose configuration the shell uses (default: `LVM_SYSTEM_DIR` when this
    /// value was made, else `/etc/lvm`). Separate processes use the environment as it is.
    #[must_use]
    pub fn system_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.real_system_dir = dir.into();
        self
    }

    /// The process id of the running shell, if one is running.
    pub async fn pid(&self) -> Option<u32> {
        self.state.lock().await.session.as_ref().and_then(|s| s.pid)
    }

    /// Why every command runs as a separate process, if the shell failed its start-up check.
    pub async fn fallback_reason(&self) -> Option<String> {
        self.state.lock().await.fallback.clone()
    }

    /// Stops the shell after a command changed physical volumes or devices; the next command starts
    /// another, which reads the devices afresh.
    async fn forget_devices(&self) {
        if let Some(s) = self.state.lock().await.session.take() {
            tracing::debug!(pid = ?s.pid, "stopping the lvm shell after a change of devices");
        }
    }

    /// `cmd` as a separate process (of this shell's program when it is an `lvm` command).
    async fn separately(&self, cmd: &Command) -> Result<Output> {
        if cmd.program == LVM && self.program != Path::new(LVM) {
            let mut own = cmd.clone();
            own.program = self.program.to_string_lossy().into_owned();
            RealRunner.run(&own).await
        } else {
            RealRunner.run(cmd).await
        }
    }

    /// A running, checked session, started if needed.
    async fn session(&self, state: &mut State, deadline: Instant) -> Result<Session, Failure> {
        if let Some(mut s) = state.session.take() {
            if !s.exited() {
                return Ok(s);
            }
            tracing::debug!(pid = ?s.pid, "the lvm shell has exited; starting another");
        }
        // A fresh mirror for every shell, so that it sees what the real directory holds now.
        state.system_dir = None;
        let dir = SystemDir::create(&self.real_system_dir).map_err(|e| {
            Failure::Unusable(format!(
                "cannot set up a private LVM_SYSTEM_DIR mirroring {}: {e}",
                self.real_system_dir.display()
            ))
        })?;
        let dir = state.system_dir.insert(dir).path.clone();
        let mut s = Session::spawn(&self.program, &dir).map_err(Failure::Spawn)?;
        let check_by = deadline.min(Instant::now() + STARTUP_TIMEOUT);
        let checked = tokio::time::timeout_at(check_by, async {
            s.send(PROBE)
                .await
                .map_err(|e| format!("writing to it failed: {e}"))?;
            match s.receive().await {
                Ok(Exchange::Reply { reply, stderr }) => match to_output(&reply, &stderr) {
                    Ok(out) if out.success() => Ok(()),
                    Ok(out) => Err(format!(
                        "`{PROBE}` failed with code {:?}: {}",
                        out.code,
                        out.stderr.trim_end()
                    )),
                    Err(e) => Err(e),
                },
                Ok(Exchange::Died { stderr, status, .. }) => Err(format!(
                    "it exited ({}): {}",
                    status.map_or_else(|| "unknown status".to_owned(), |s| s.to_string()),
                    stderr.trim_end()
                )),
                Err(ProtocolError(e)) => Err(e),
            }
        })
        .await;
        match checked {
            Ok(Ok(())) => {
                tracing::debug!(pid = ?s.pid, "lvm shell started");
                Ok(s)
            }
            Ok(Err(why)) => Err(Failure::Unusable(format!(
                "the lvm shell ({}) failed its start-up check: {why}",
                self.program.display()
            ))),
            Err(_) if check_by < deadline => Err(Failure::Unusable(format!(
                "the lvm shell ({}) did not answer `{PROBE}` within {STARTUP_TIMEOUT:?}",
                self.program.display()
            ))),
            Err(_) => Err(Failure::Timeout),
        }
    }

    /// Runs one line in the shell.
    async fn exchange(
        &self,
        state: &mut State,
        line: &str,
        deadline: Instant,
    ) -> Result<Exchange, Failure> {
        // A shell that died while idle did not read the line: start another and send it again, once.
        let mut attempts = 0;
        loop {
            // Taken out of the state while in use: if this future is dropped mid-command, the session is
            // dropped with it, which kills the process.
            let mut s = self.session(state, deadline).await?;
            attempts += 1;
            if let Err(e) = s.send(line).await {
                if attempts < 2 {
                    tracing::debug!(pid = ?s.pid, error = %e, "the lvm shell did not take the command; starting another");
                    continue;
                }
                return Err(Failure::Unusable(format!(
                    "a new lvm shell did not take a command: {e}"
                )));
            }
            return match tokio::time::timeout_at(deadline, s.receive()).await {
                Err(_) => Err(Failure::Timeout),
                Ok(Err(ProtocolError(e))) => Err(Failure::Protocol(e)),
                Ok(Ok(reply @ Exchange::Reply { .. })) => {
                    state.session = Some(s);
                    Ok(reply)
                }
                Ok(Ok(died)) => Ok(died),
            };
        }
    }
}

impl Runner for LvmShell {
    async fn run(&self, cmd: &Command) -> Result<Output> {
        let line = match shell_line(cmd) {
            Ok(line) => line,
            Err(why) => {
                if cmd.program == LVM {
                    tracing::debug!(argv = %cmd.argv(), why, "running as a separate process");
                }
                let output = self.separately(cmd).await;
                if changes_devices(cmd) {
                    self.forget_devices().await;
                }
                return output;
            }
        };
        let argv = cmd.argv();
        let started = Instant::now();
        let deadline = started + cmd.timeout;
        let timeout = || {
            tracing::warn!(%argv, timeout = ?cmd.timeout, "command timed out in the lvm shell; the shell was killed");
            Error::Timeout {
                argv: argv.clone(),
                timeout: cmd.timeout,
            }
        };
        let Ok(mut state) = tokio::time::timeout_at(deadline, self.state.lock()).await else {
            return Err(timeout());
        };
        if state.fallback.is_some() {
            drop(state);
            return self.separately(cmd).await;
        }
        let result = self.exchange(&mut state, &line, deadline).await;
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match result {
            Ok(Exchange::Reply { reply, stderr }) => match to_output(&reply, &stderr) {
                Ok(output) => {
                    if output.success() {
                        tracing::debug!(%argv, code = ?output.code, elapsed_ms, "command finished (lvm shell)");
                    } else {
                        tracing::debug!(%argv, code = ?output.code, elapsed_ms, stderr = %output.stderr.trim_end(), "command failed (lvm shell)");
                    }
                    Ok(output)
                }
                Err(detail) => {
                    state.session = None;
                    Err(Error::Parse { argv, detail })
                }
            },
            Ok(Exchange::Died {
                stdout,
                mut stderr,
                status,
            }) => {
                let how = status.map_or_else(|| "unknown status".to_owned(), |s| s.to_string());
                tracing::warn!(%argv, status = %how, elapsed_ms, "the lvm shell died during a command");
                stderr.push_str(&format!(
                    "  lvms: the lvm shell exited ({how}) before reporting the result of this command\n"
                ));
                // Never a success: the result is unknown.
                let code = status.and_then(|s| s.code()).filter(|&c| c != 0);
                Ok(Output {
                    code,
                    stdout,
                    stderr,
                })
            }
            Err(Failure::Timeout) => Err(timeout()),
            Err(Failure::Protocol(detail)) => {
                tracing::warn!(%argv, %detail, "the lvm shell's reply was not understood; the shell was killed");
                Err(Error::Parse { argv, detail })
            }
            Err(Failure::Spawn(source)) => Err(Error::Spawn {
                argv: crate::error::Argv(vec![self.program.to_string_lossy().into_owned()]),
                source,
            }),
            Err(Failure::Unusable(why)) => {
                tracing::warn!(reason = %why, "lvm commands run as separate processes from now on");
                state.fallback = Some(why);
                state.session = None;
                drop(state);
                self.separately(cmd).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::lvm::{classify, parse_lvs};

    macro_rules! real {
        ($name:literal) => {
            include_str!(concat!("../tests/fixtures/real/", $name))
        };
    }

    /// lvm2's `lvm_split` (tools/lvmcmdline.c, 2.03), to check the quoting against.
    fn lvm_split(line: &str) -> Vec<String> {
        let b = line.as_bytes();
        let mut words = Vec::new();
        let mut i = 0;
        while i < b.len() {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            if i == b.len() || b[i] == b'#' {
                break;
            }
            let quote = (b[i] == b'\'' || b[i] == b'"').then(|| {
                i += 1;
                b[i - 1]
            });
            let start = i;
            while i < b.len() && quote.map_or(!b[i].is_ascii_whitespace(), |q| b[i] != q) {
                i += 1;
            }
            words.push(line[start..i].to_owned());
            i += 1;
        }
        words
    }

    fn lvm(args: &[&str]) -> Command {
        Command::new("lvm", args.iter().copied())
    }

    // ---- the line ----

    #[test]
    fn names_paths_sizes_and_tags_go_unquoted() {
        for arg in [
            "lvcreate",
            "--virtualsize",
            "1073741824b",
            "vg1/thin-1_a.b+c",
            "/dev/disk/by-id/virtio-d0",
            "a+b.c-d/e=f!g:h&i#j",
            "lvms.topolvm.io/volume=pvc-1",
        ] {
            assert_eq!(quote_arg(arg).as_deref(), Some(arg));
        }
    }

    #[test]
    fn words_lvm_split_would_misread_are_quoted() {
        assert_eq!(
            quote_arg("#leading-hash").as_deref(),
            Some("'#leading-hash'")
        );
        assert_eq!(quote_arg("").as_deref(), Some("''"));
        assert_eq!(quote_arg("a b").as_deref(), Some("'a b'"));
        assert_eq!(quote_arg("'q'").as_deref(), Some("\"'q'\""));
        assert_eq!(quote_arg("\"d\"").as_deref(), Some("'\"d\"'"));
        assert_eq!(quote_arg("it's \"x\""), None);
        for bad in ["a\nb", "tab\there", "nul\0", "caf\u{e9}", "\r"] {
            assert_eq!(quote_arg(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn quoted_lines_split_back_into_the_same_arguments() {
        let cases: &[&[&str]] = &[
            &[
                "lvcreate", "--addtag", "#a", "--addtag", "b#", "--name", "x", "vg",
            ],
            &["vgs", "", "a b", "'", "\"", "x'y", "#", "##", "a\"b'"],
            &["lvchange", "--addtag", "_+.-/=!:&#", "vg/lv"],
        ];
        for args in cases {
            let cmd = lvm(args);
            let line = shell_line(&cmd).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert_eq!(lvm_split(&line), *args, "line {line:?}");
        }
    }

    #[test]
    fn lvm_split_reading_matches_the_recorded_transcript() {
        // The tags of this line came back from `lvs` as they were sent.
        let line = real!("lvm-shell-create.in.txt").lines().nth(3).unwrap();
        let words = lvm_split(line);
        assert!(words.contains(&"#leading-hash".to_owned()), "{words:?}");
        assert!(
            real!("lvm-shell-create.txt")
                .contains(r##""lv_tags":"#leading-hash,a+b.c-d/e=f!g:h&i#j""##)
        );
    }

    #[test]
    fn commands_the_shell_cannot_take_are_recognised() {
        assert_eq!(
            shell_line(&lvm(&["lvs", "--reportformat", "json", "vg1/lv 1"])).as_deref(),
            Ok("lvs --reportformat json 'vg1/lv 1'")
        );
        assert!(shell_line(&Command::new("lvcreate", ["-n", "x"])).is_err());
        assert!(shell_line(&Command::new("/sbin/lvm", ["lvs"])).is_err());
        assert!(shell_line(&lvm(&[])).is_err());
        for first in [
            "exit", "quit", "lastlog", "lvm", "--help", "-h", "", "Lvs", "#x",
        ] {
            assert!(shell_line(&lvm(&[first, "vg1"])).is_err(), "{first:?}");
        }
        assert!(shell_line(&lvm(&["lvs", "a\nb"])).is_err());
        assert!(
            shell_line(&lvm(&[
                "lvchange",
                "--devicesfile",
                "lvms-san.devices",
                "-aey",
                "san/v"
            ]))
            .is_err(),
            "a shared class's command runs on its own"
        );
        for device_command in [
            "pvs", "pvcreate", "pvremove", "pvresize", "vgcreate", "vgextend", "vgreduce",
        ] {
            assert!(
                shell_line(&lvm(&[device_command, "/dev/vdb"])).is_err(),
                "{device_command}"
            );
        }
        for shell_command in [
            "lvcreate", "lvremove", "lvchange", "lvextend", "lvs", "vgs", "vgchange", "vgremove",
        ] {
            assert!(
                shell_line(&lvm(&[shell_command, "vg1"])).is_ok(),
                "{shell_command}"
            );
            assert!(!changes_devices(&lvm(&[shell_command, "vg1"])));
        }
        assert!(changes_devices(&lvm(&["pvcreate", "/dev/vdb"])));
        assert!(changes_devices(&lvm(&["vgextend", "vg1", "/dev/vdb"])));
        assert!(!changes_devices(&lvm(&["pvs"])));
        assert!(!changes_devices(&Command::new("pvcreate", ["/dev/vdb"])));
        let mut args = vec!["vgs"; MAX_WORDS];
        assert!(shell_line(&lvm(&args)).is_ok());
        args.push("vgs");
        assert!(shell_line(&lvm(&args)).is_err());
    }

    // ---- the reply ----

    /// Every reply of a transcript, in order, and what follows the last one.
    fn replies(transcript: &str) -> (Vec<Reply>, String) {
        let mut buf = transcript.as_bytes();
        let mut out = Vec::new();
        while let Scan::Complete(reply, used) = scan(buf) {
            out.push(reply);
            buf = &buf[used..];
        }
        (out, String::from_utf8_lossy(buf).into_owned())
    }

    fn output(reply: &Reply) -> Output {
        to_output(reply, "").unwrap()
    }

    #[test]
    fn a_transcript_splits_into_one_reply_per_command() {
        let sent = real!("lvm-shell-create.in.txt").lines().count();
        let (rs, rest) = replies(real!("lvm-shell-create.txt"));
        // One more at the end: what the shell prints at EOF.
        assert_eq!(rs.len(), sent + 1);
        assert_eq!(rest, "");
        assert!(rs[..sent].iter().all(|r| r.preamble.is_empty()));
        assert_eq!(rs[sent].preamble, "\n");
        assert!(
            to_output(&rs[sent], "")
                .unwrap_err()
                .contains("no status row")
        );
    }

    #[test]
    fn every_prefix_of_a_reply_is_incomplete() {
        let text = real!("lvm-shell-create.txt");
        let Scan::Complete(_, used) = scan(text.as_bytes()) else {
            panic!("no reply")
        };
        for end in 0..used - 1 {
            assert_eq!(scan(&text.as_bytes()[..end]), Scan::Incomplete, "at {end}");
        }
    }

    #[test]
    fn output_that_is_not_the_protocol_is_invalid() {
        assert!(matches!(scan(b"  {\"log\": x}\n"), Scan::Invalid(_)));
        // Text lines before the document are kept.
        let Scan::Complete(r, used) = scan(b"hello\n  {\"log\": []}\n") else {
            panic!()
        };
        assert_eq!(
            (r.preamble.as_str(), r.json.as_str(), used),
            ("hello\n", "  {\"log\": []}", 20)
        );
        assert_eq!(scan(b"partial line"), Scan::Incomplete);
    }

    #[test]
    fn successful_mutations_print_their_messages_on_stdout() {
        let (rs, _) = replies(real!("lvm-shell-create.txt"));
        assert_eq!(
            output(&rs[0]),
            Output::ok("  Physical volume \"/dev/vda\" successfully created.\n")
        );
        let thin = output(&rs[3]);
        assert_eq!(thin.code, Some(0));
        assert!(
            thin.stdout
                .ends_with("  Logical volume \"thin1\" created.\n"),
            "{}",
            thin.stdout
        );
        // A warning goes to stderr even when the command succeeds, as it does from a process.
        assert!(
            thin.stderr
                .starts_with("  WARNING: Sum of all thin volume sizes"),
            "{}",
            thin.stderr
        );
    }

    #[test]
    fn a_report_is_stdout_as_printed_and_parses() {
        let (rs, _) = replies(real!("lvm-shell-create.txt"));
        let out = output(&rs[4]);
        assert_eq!(out.code, Some(0));
        assert_eq!(out.stderr, "");
        assert_eq!(out.stdout, format!("{}\n", rs[4].json));
        let lvs = parse_lvs(&out.stdout).unwrap();
        let names: Vec<&str> = lvs.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["pool", "thin1"]);
        assert_eq!(lvs[1].tags, ["#leading-hash", "a+b.c-d/e=f!g:h&i#j"]);
        assert_eq!(lvs[1].pool_lv.as_deref(), Some("pool"));
        assert_eq!(lvs[1].size, 1 << 30);
    }

    #[test]
    fn failures_keep_lvm_exit_codes_and_error_texts() {
        let (rs, _) = replies(real!("lvm-shell-errors.txt"));
        let cmd = lvm(&["lvcreate"]);
        let exists = output(&rs[1]);
        assert_eq!(exists.code, Some(5));
        assert_eq!(
            exists.stderr,
            "  Logical Volume \"thin1\" already exists in volume group \"shvg\"\n"
        );
        assert!(matches!(classify(&cmd, exists), Error::AlreadyExists(_)));

        let missing = output(&rs[2]);
        assert_eq!(
            (missing.code, missing.stderr.as_str()),
            (
                Some(5),
                "  Failed to find logical volume \"shvg/missing\"\n"
            )
        );
        assert!(matches!(classify(&cmd, missing), Error::NotFound(_)));

        // A report command that fails still prints its (empty) report.
        let no_vg = output(&rs[3]);
        assert_eq!(no_vg.code, Some(5));
        assert_eq!(
            no_vg.stderr,
            "  Volume group \"nosuchvg\" not found\n  Cannot process volume group nosuchvg\n"
        );
        assert!(crate::lvm::parse_vgs(&no_vg.stdout).unwrap().is_empty());
        assert!(matches!(classify(&cmd, no_vg), Error::NotFound(_)));

        let big = output(&rs[4]);
        assert_eq!(big.code, Some(5));
        assert!(matches!(classify(&cmd, big), Error::InsufficientSpace(_)));

        let no_cmd = output(&rs[5]);
        assert_eq!(no_cmd.code, Some(2));
        assert_eq!(
            no_cmd.stderr,
            "  No such command 'nosuchcommand'.  Try 'help'.\n"
        );
    }

    #[test]
    fn getopt_complaints_on_stderr_come_before_the_logged_errors() {
        let raw = real!("lvm-shell-errors.stderr.txt");
        assert_eq!(raw, "lvcreate: unrecognized option '--nosuchoption'\n");
        let (rs, _) = replies(real!("lvm-shell-errors.txt"));
        let out = to_output(&rs[6], raw).unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(
            out.stderr,
            "lvcreate: unrecognized option '--nosuchoption'\n  Error during parsing of command line.\n"
        );
        // A tag with quotes in it arrives with its quotes (and LVM refuses it).
        let quoted = output(&rs[0]);
        assert_eq!(quoted.code, Some(3));
        assert!(
            quoted
                .stderr
                .contains("Invalid argument for --addtag: 'quoted'")
        );
    }

    #[test]
    fn answered_questions_read_like_questions_answered_by_dev_null() {
        // What `receive` keeps: the question, then "[n]" where the capture script marked its answer.
        let raw = real!("lvm-shell-prompt.stderr.txt").replace("<answered n>\n", "[n]\n");
        let mut questions = raw.lines();
        let (rs, _) = replies(real!("lvm-shell-prompt.txt"));

        let pv = to_output(&rs[0], &format!("{}\n", questions.next().unwrap())).unwrap();
        assert_eq!(
            pv.stderr,
            "WARNING: ext4 signature detected on /dev/vdb at offset 1080. Wipe it? [y/n]: [n]\n  \
             Aborted wiping of ext4.\n  1 existing signature left on the device.\n"
        );
        match classify(&lvm(&["pvcreate", "/dev/vdb"]), pv) {
            Error::SignatureExists { device, signature } => {
                assert_eq!((device.as_str(), signature.as_str()), ("/dev/vdb", "ext4"));
            }
            other => panic!("{other:?}"),
        }

        let vg = to_output(&rs[1], &format!("{}\n", questions.next().unwrap())).unwrap();
        assert_eq!(vg.code, Some(5));
        assert!(matches!(
            classify(&lvm(&["vgremove", "shvg"]), vg),
            Error::InUse(_)
        ));
    }

    #[test]
    fn a_line_of_64_words_gets_no_reply_at_all() {
        let sent: Vec<&str> = real!("lvm-shell-limits.in.txt").lines().collect();
        let words: Vec<usize> = sent.iter().map(|l| lvm_split(l).len()).collect();
        assert_eq!(&words[..2], [MAX_WORDS, MAX_WORDS + 1]);
        let statuses = real!("lvm-shell-limits.txt")
            .matches(r#""log_context":"shell", "log_object_type":"cmd""#)
            .count();
        // Each reply has one shell status row (the EOF document has none); the 64-word line has none.
        assert_eq!(statuses, sent.len() - 1);
        // The 30 KiB line of tags worked.
        assert!(sent[3].len() > 30_000);
    }

    /// Why device commands run as separate processes: the shell saw the loop device detached, and goes on
    /// seeing it at size 0 after it was attached, even after a separate `pvcreate` made it a PV.
    #[test]
    fn a_shell_sees_a_reattached_device_at_its_old_size() {
        let sent = real!("lvm-shell-stale-size.in.txt");
        assert!(sent.contains("# !losetup /dev/loop0 "), "{sent}");
        let (rs, _) = replies(real!("lvm-shell-stale-size.txt"));
        let create = output(&rs[1]);
        assert_eq!(
            create,
            Output::failed(
                5,
                "  Cannot use /dev/loop0: device is too small (pv_min_size)\n"
            )
        );
        let pvs = output(&rs[2]);
        assert_eq!(pvs.code, Some(5));
        assert!(pvs.stderr.contains("device is too small"), "{}", pvs.stderr);
        assert!(crate::lvm::parse_pvs(&pvs.stdout).unwrap().is_empty());
    }

    // ---- the process, with a stand-in for lvm ----

    /// A stand-in for `lvm` without arguments, speaking the shell's protocol.
    const FAKE_LVM: &str = r#"#!/bin/sh
reply() { # CODE [TYPE MESSAGE]...
  code=$1; shift
  printf '  {\n      "log": [\n'
  while [ $# -ge 2 ]; do
    printf '          {"log_seq_num":"1", "log_type":"%s", "log_context":"processing", "log_message":"%s", "log_ret_code":"0"},\n' "$1" "$2"
    shift 2
  done
  printf '          {"log_seq_num":"9", "log_type":"status", "log_context":"shell", "log_message":"x", "log_ret_code":"%s"}\n      ]\n  }\n' "$code"
}
set -f
while IFS= read -r line; do
  set -- $line
  cmd=$1; shift
  case "$cmd" in
    formats) reply 1 print lvm2 ;;
    echo) reply 1 print "$*" ;;
    env) reply 1 print "$LVM_SYSTEM_DIR" print "$LVM_COMMAND_PROFILE" print "$LC_ALL" print "$HOME" ;;
    pid) reply 1 print "$$" ;;
    fail) reply 5 error 'Volume group \"x\" not found' ;;
    noise) printf "lvcreate: unrecognized option '--x'\n" >&2; reply 3 error 'Error during parsing of command line.' ;;
    ask) printf 'Really? [y/n]: ' >&2; IFS= read -r answer; reply 5 error "answer was $answer" ;;
    report) printf '  {\n      "report": [{"vg": [{"vg_name":"vg1"}]}]\n      ,\n      "log": [{"log_type":"status", "log_context":"shell", "log_message":"success", "log_ret_code":"1"}]\n  }\n' ;;
    sleep) sleep "$1"; reply 1 ;;
    die) exit 0 ;;
    *) reply 2 error "No such command '$cmd'.  Try 'help'." ;;
  esac
done
"#;

    struct Fake {
        dir: tempfile::TempDir,
    }

    impl Fake {
        fn new(script: &str) -> Self {
            use std::os::unix::fs::PermissionsExt;
            let dir = tempfile::tempdir().unwrap();
            let program = dir.path().join("lvm");
            std::fs::write(&program, script).unwrap();
            std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
            let etc = dir.path().join("etc");
            std::fs::create_dir_all(etc.join("profile")).unwrap();
            std::fs::write(etc.join("lvm.conf"), "# real config\n").unwrap();
            std::fs::write(etc.join("profile/thin-generic.profile"), "# a profile\n").unwrap();
            Self { dir }
        }

        fn shell(&self) -> LvmShell {
            LvmShell::with_program(self.dir.path().join("lvm"))
                .system_dir(self.dir.path().join("etc"))
        }
    }

    async fn run(shell: &LvmShell, args: &[&str]) -> Output {
        shell.run(&lvm(args)).await.unwrap()
    }

    /// Waits until `pid` has exited (gone, or a zombie).
    fn wait_gone(pid: u32) {
        for _ in 0..200 {
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => return,
                Ok(s) if s.rsplit(") ").next().is_some_and(|r| r.starts_with('Z')) => return,
                Ok(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        panic!("process {pid} is still running");
    }

    #[tokio::test]
    async fn commands_share_one_process_and_replies_map_to_outputs() {
        let fake = Fake::new(FAKE_LVM);
        let shell = fake.shell();
        assert_eq!(
            shell.pid().await,
            None,
            "nothing runs before the first command"
        );
        assert_eq!(
            run(&shell, &["echo", "a", "b"]).await,
            Output::ok("  a b\n")
        );
        let pid = shell.pid().await.unwrap();
        assert_eq!(run(&shell, &["echo", "c"]).await, Output::ok("  c\n"));
        assert_eq!(shell.pid().await, Some(pid));
        assert_eq!(
            run(&shell, &["fail"]).await,
            Output::failed(5, "  Volume group \"x\" not found\n")
        );
        let report = run(&shell, &["report"]).await;
        assert!(report.success());
        let doc: serde_json::Value = serde_json::from_str(&report.stdout).unwrap();
        assert_eq!(doc["report"][0]["vg"][0]["vg_name"], "vg1");
        assert_eq!(shell.fallback_reason().await, None);
    }

    #[tokio::test]
    async fn the_shell_gets_a_private_system_dir_with_the_real_config_and_its_profile() {
        let fake = Fake::new(FAKE_LVM);
        let shell = fake.shell();
        let env = run(&shell, &["env"]).await.stdout;
        let lines: Vec<&str> = env.lines().map(str::trim).collect();
        let dir = PathBuf::from(lines[0]);
        assert_eq!(lines[1..], [SHELL_PROFILE, "C", lines[0]]);
        let etc = fake.dir.path().join("etc");
        assert_eq!(
            std::fs::read_link(dir.join("lvm.conf")).unwrap(),
            etc.join("lvm.conf")
        );
        assert_eq!(
            std::fs::read_link(dir.join("profile/thin-generic.profile")).unwrap(),
            etc.join("profile/thin-generic.profile")
        );
        let profile = std::fs::read_to_string(dir.join("profile/lvms-shell.profile")).unwrap();
        assert!(profile.contains("output_format = \"json\""), "{profile}");
        assert!(
            profile.contains("command_log_selection = \"all\""),
            "{profile}"
        );
        // LVM would create these on its first metadata change.
        assert!(etc.join("backup").is_dir() && etc.join("archive").is_dir());
        assert_eq!(
            std::fs::read_link(dir.join("backup")).unwrap(),
            etc.join("backup")
        );
        drop(shell);
        assert!(!dir.exists(), "removed with the runner");
        assert!(etc.join("lvm.conf").exists(), "the real config stays");
    }

    #[tokio::test]
    async fn stderr_written_before_the_reply_is_always_in_the_output() {
        let fake = Fake::new(FAKE_LVM);
        let shell = fake.shell();
        for _ in 0..50 {
            assert_eq!(
                run(&shell, &["noise"]).await,
                Output::failed(
                    3,
                    "lvcreate: unrecognized option '--x'\n  Error during parsing of command line.\n"
                )
            );
        }
    }

    #[tokio::test]
    async fn a_question_is_answered_no_and_reads_like_stdin_at_dev_null() {
        let fake = Fake::new(FAKE_LVM);
        let shell = fake.shell();
        let out = run(&shell, &["ask"]).await;
        assert_eq!(
            out,
            Output::failed(5, "Really? [y/n]: [n]\n  answer was n\n")
        );
        assert_eq!(run(&shell, &["echo", "next"]).await, Output::ok("  next\n"));
    }

    #[tokio::test]
    async fn a_timeout_kills_the_shell_and_the_next_command_starts_another() {
        let fake = Fake::new(FAKE_LVM);
        let shell = fake.shell();
        run(&shell, &["echo"]).await;
        let pid = shell.pid().await.unwrap();
        let started = std::time::Instant::now();
        let err = shell
            .run(&lvm(&["sleep", "5"]).timeout(Duration::from_millis(300)))
            .await
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3));
        match err {
            Error::Timeout { argv, timeout } => {
                assert_eq!(argv.to_string(), "lvm sleep 5");
                assert_eq!(timeout, Duration::from_millis(300));
            }
            other => panic!("{other:?}"),
        }
        wait_gone(pid);
        assert_eq!(
            run(&shell, &["echo", "again"]).await,
            Output::ok("  again\n")
        );
        assert_ne!(shell.pid().await, Some(pid));
    }

    #[tokio::test]
    async fn a_dropped_call_kills_the_shell() {
        let fake = Fake::new(FAKE_LVM);
        let shell = fake.shell();
        run(&shell, &["echo"]).await;
        let pid = shell.pid().await.unwrap();
        let sleep = lvm(&["sleep", "5"]);
        let call = shell.run(&sleep);
        assert!(
            tokio::time::timeout(Duration::from_millis(300), call)
                .await
                .is_err()
        );
        assert_eq!(shell.pid().await, None);
        wait_gone(pid);
        assert_eq!(
            run(&shell, &["echo", "fresh"]).await,
            Output::ok("  fresh\n")
        );
    }

    #[tokio::test]
    async fn a_shell_killed_while_idle_is_replaced() {
        let fake = Fake::new(FAKE_LVM);
        let shell = fake.shell();
        let pid: u32 = run(&shell, &["pid"]).await.stdout.trim().parse().unwrap();
        assert_eq!(shell.pid().await, Some(pid));
        RealRunner
            .run(&Command::new("kill", ["-9".to_owned(), pid.to_string()]))
            .await
            .unwrap();
        wait_gone(pid);
        assert_eq!(run(&shell, &["echo", "x"]).await, Output::ok("  x\n"));
        assert_ne!(shell.pid().await, Some(pid));
    }

    #[tokio::test]
    async fn a_shell_dying_during_a_command_is_a_failure_never_a_success() {
        let fake = Fake::new(FAKE_LVM);
        let shell = fake.shell();
        let out = run(&shell, &["die"]).await;
        assert_eq!(out.code, None);
        assert!(
            out.stderr
                .contains("exited (exit status: 0) before reporting"),
            "{}",
            out.stderr
        );
        assert!(matches!(
            classify(&lvm(&["die"]), out),
            Error::CommandFailed { code: None, .. }
        ));
        assert_eq!(run(&shell, &["echo", "x"]).await, Output::ok("  x\n"));
    }

    #[tokio::test]
    async fn concurrent_callers_each_get_their_own_reply() {
        let fake = Fake::new(FAKE_LVM);
        let shell = Arc::new(fake.shell());
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..20 {
            let shell = Arc::clone(&shell);
            calls.spawn(async move { (i, run(&shell, &["echo", &i.to_string()]).await) });
        }
        while let Some(done) = calls.join_next().await {
            let (i, out) = done.unwrap();
            assert_eq!(out, Output::ok(format!("  {i}\n")));
        }
    }

    #[tokio::test]
    async fn commands_the_shell_cannot_take_run_as_processes() {
        let fake = Fake::new(FAKE_LVM);
        let shell = fake.shell();
        // The stand-in run as a process reads EOF from /dev/null at once and prints nothing.
        let mut args = vec!["echo"; MAX_WORDS + 1];
        assert_eq!(run(&shell, &args).await, Output::ok(""));
        args.truncate(2);
        assert_eq!(run(&shell, &["echo", "a\tb"]).await, Output::ok(""));
        assert_eq!(shell.pid().await, None, "no shell was needed");
        let out = shell
            .run(&Command::new("echo", ["not", "lvm"]))
            .await
            .unwrap();
        assert_eq!(out, Output::ok("not lvm\n"));
    }

    #[tokio::test]
    async fn device_commands_run_as_processes_and_changes_restart_the_shell() {
        let fake = Fake::new(FAKE_LVM);
        let shell = fake.shell();
        run(&shell, &["echo"]).await;
        let pid = shell.pid().await.unwrap();
        // The stand-in run as a process prints nothing: these did not go to the shell.
        assert_eq!(run(&shell, &["pvs"]).await, Output::ok(""));
        assert_eq!(shell.pid().await, Some(pid), "a read keeps the shell");
        assert_eq!(run(&shell, &["pvcreate", "/dev/vdb"]).await, Output::ok(""));
        assert_eq!(shell.pid().await, None, "a change stops it");
        wait_gone(pid);
        assert_eq!(run(&shell, &["echo", "x"]).await, Output::ok("  x\n"));
        assert_ne!(shell.pid().await, Some(pid));
    }

    #[tokio::test]
    async fn a_shell_failing_its_start_up_check_sends_everything_to_processes() {
        let fake = Fake::new("#!/bin/sh\necho 'no shell here'\necho \"args: $*\"\n");
        let shell = fake.shell();
        let out = run(&shell, &["echo", "x"]).await;
        assert_eq!(out, Output::ok("no shell here\nargs: echo x\n"));
        let why = shell.fallback_reason().await.unwrap();
        assert!(why.contains("failed its start-up check"), "{why}");
        assert_eq!(
            run(&shell, &["pvs"]).await,
            Output::ok("no shell here\nargs: pvs\n")
        );
    }

    #[tokio::test]
    async fn a_missing_program_is_a_spawn_error() {
        let fake = Fake::new(FAKE_LVM);
        let shell = LvmShell::with_program("/nonexistent/lvms-no-lvm")
            .system_dir(fake.dir.path().join("etc"));
        let err = shell.run(&lvm(&["vgs"])).await.unwrap_err();
        assert!(matches!(err, Error::Spawn { .. }), "{err:?}");
        assert_eq!(shell.fallback_reason().await, None);
    }
}
