//! The test VM's command protocol, both ends: the server a guest runs (`xtask guest-serve`, what
//! `kubectl exec` would be to a node) and the one client every test and task uses to reach it
//! through a forwarded port on host loopback (qemu's hostfwd, or a user-mode guest's relay).
//!
//! One request per connection: a JSON line `{"cmd": "…", "stdin": "…"}`, answered by one JSON
//! object `{"code": N, "out": "…", "err": "…"}` (code -1 when the command died by a signal). The
//! request `{"cmd": "", "poweroff": true}` powers the VM off.

use std::{
    io::{self, BufRead as _, BufReader, Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs as _},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

/// What a command did in the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    pub code: i64,
    pub out: String,
    pub err: String,
}

impl Ran {
    /// stdout then stderr.
    pub fn output(&self) -> String {
        format!("{}{}", self.out, self.err)
    }
}

/// A guest's command server at `addr` (`127.0.0.1:<forwarded port>`).
#[derive(Debug, Clone)]
pub struct Guest {
    addr: String,
    /// Names the guest in panics (`node1`, `the VM`).
    pub name: String,
}

/// How long one command may take before the client gives up on its answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(600);

impl Guest {
    pub fn new(name: &str, addr: impl Into<String>) -> Self {
        Self {
            addr: addr.into(),
            name: name.to_owned(),
        }
    }

    fn connect(&self, timeout: Duration) -> io::Result<TcpStream> {
        let addr: SocketAddr = self
            .addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::other(format!("{}: no address", self.addr)))?;
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(timeout))?;
        Ok(stream)
    }

    /// Runs `cmd` with `sh -c` in the guest, `stdin` on its standard input; an error when the
    /// guest could not be reached or did not answer within `timeout`. A command that starts a
    /// daemon must redirect its output and stdin (`> log 2>&1 < /dev/null &`).
    pub fn try_run(&self, cmd: &str, stdin: &str, timeout: Duration) -> io::Result<Ran> {
        let mut stream = self.connect(timeout)?;
        writeln!(stream, "{}", json!({ "cmd": cmd, "stdin": stdin }))?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply)?;
        let v: Value = serde_json::from_str(&reply).map_err(|e| {
            io::Error::other(format!(
                "{}: the answer to `{cmd}`: {e}: {reply}",
                self.name
            ))
        })?;
        Ok(Ran {
            code: v["code"].as_i64().unwrap_or(-1),
            out: v["out"].as_str().unwrap_or_default().to_owned(),
            err: v["err"].as_str().unwrap_or_default().to_owned(),
        })
    }

    /// [`Self::try_run`] that panics when the guest cannot be reached.
    pub fn sh_with(&self, cmd: &str, stdin: &str) -> Ran {
        self.try_run(cmd, stdin, ANSWER_TIMEOUT)
            .unwrap_or_else(|e| {
                panic!(
                    "{}: `{cmd}`: the command server at {}: {e}",
                    self.name, self.addr
                )
            })
    }

    pub fn sh(&self, cmd: &str) -> Ran {
        self.sh_with(cmd, "")
    }

    /// Runs `cmd` and panics unless it exits 0; its stdout.
    #[track_caller]
    pub fn ok(&self, cmd: &str) -> String {
        let r = self.sh(cmd);
        assert_eq!(
            r.code, 0,
            "{}: `{cmd}` failed:\n{}\n{}",
            self.name, r.out, r.err
        );
        r.out
    }

    /// Whether the command server answers a trivial command (false once its machine is gone).
    pub fn alive(&self) -> bool {
        self.try_run("true", "", Duration::from_secs(20))
            .is_ok_and(|r| r.code == 0)
    }

    /// Waits until the command server answers, at most `timeout`.
    pub fn wait_ready(&self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.alive() {
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{}'s command server did not answer within {timeout:?}",
                        self.name
                    ),
                ));
            }
            thread::sleep(Duration::from_secs(1));
        }
        Ok(())
    }

    /// Asks the guest to power off (no answer comes).
    pub fn poweroff(&self) {
        if let Ok(mut stream) = self.connect(Duration::from_secs(5)) {
            let _ = writeln!(stream, "{}", json!({"cmd": "", "poweroff": true}));
        }
    }
}

/// Kills a machine at once, as a power loss would: the process `pid` (qemu, or a user-mode kernel)
/// and every process under it. A user-mode guest's processes are host processes under its
/// kernel's; killed alone, the kernel would leave them running unsupervised.
pub fn kill_machine(pid: u32) {
    // Stopped first, so that none forks between the listing and the kill.
    let mut tree = Vec::new();
    for _ in 0..3 {
        tree = descendants(pid);
        signal("STOP", &tree);
    }
    signal("KILL", &tree);
}

/// `pid` and the processes under it, from `/proc/<pid>/task/*/children`.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while let Some(&p) = all.get(i) {
        let tasks = std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten();
        for t in tasks.filter_map(Result::ok) {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            all.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
        i += 1;
    }
    all.sort_unstable();
    all.dedup();
    all
}

fn signal(name: &str, pids: &[u32]) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status();
}

/// The server, in the guest: answers requests on `port` (all addresses) until the VM stops.
pub fn serve(port: u16) -> io::Result<()> {
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))?;
    println!("guest-serve: listening on {port}");
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        thread::spawn(move || {
            if let Err(e) = answer(stream) {
                eprintln!("guest-serve: {e}");
            }
        });
    }
    Ok(())
}

fn answer(stream: TcpStream) -> io::Result<()> {
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let req: Value = serde_json::from_str(&line)
        .map_err(|e| io::Error::other(format!("not a JSON request line: {e}")))?;
    if req["poweroff"] == true {
        let _ = Command::new("sync").status();
        return std::fs::write("/proc/sysrq-trigger", "o");
    }
    let cmd = req["cmd"].as_str().unwrap_or_default();
    let mut child = Command::new("sh")
        .args(["-c", cmd])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(req["stdin"].as_str().unwrap_or_default().as_bytes())?;
    }
    let out = child.wait_with_output()?;
    let reply = json!({
        "code": out.status.code().unwrap_or(-1),
        "out": String::from_utf8_lossy(&out.stdout),
        "err": String::from_utf8_lossy(&out.stderr),
    });
    (&stream).write_all(reply.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server on a loopback port of its own, and a client of it.
    fn served() -> Guest {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                thread::spawn(move || answer(stream));
            }
        });
        Guest::new("test", format!("127.0.0.1:{port}"))
    }

    #[test]
    fn a_killed_machine_leaves_none_of_its_processes() {
        // A parent whose children and grandchildren would outlive it, as a user-mode guest's do.
        let mut parent = Command::new("sh")
            .args(["-c", "sleep 300 & sh -c 'sleep 300 & wait' & wait"])
            .spawn()
            .unwrap();
        let pid = parent.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        while descendants(pid).len() < 4 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        let tree = descendants(pid);
        assert_eq!(tree.len(), 4, "{tree:?}");
        kill_machine(pid);
        let _ = parent.wait();
        thread::sleep(Duration::from_millis(100));
        for p in &tree[1..] {
            let state = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            // Gone, or a zombie until init reaps it.
            assert!(state.is_empty() || state.contains(") Z "), "{p}: {state}");
        }
    }

    #[test]
    fn a_command_answers_with_its_code_output_and_errors() {
        let g = served();
        let r = g.sh_with("read x; echo out-$x; echo err >&2; exit 3", "in\n");
        assert_eq!(
            r,
            Ran {
                code: 3,
                out: "out-in\n".into(),
                err: "err\n".into()
            }
        );
        assert_eq!(g.ok("printf hi"), "hi");
        assert!(g.alive());
    }

    #[test]
    fn an_unreachable_guest_is_not_alive_and_try_run_says_so() {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let g = Guest::new("gone", format!("127.0.0.1:{port}"));
        assert!(!g.alive());
        assert!(g.try_run("true", "", Duration::from_secs(1)).is_err());
        assert!(g.wait_ready(Duration::from_millis(10)).is_err());
    }
}
