//! `xtask guest-serve`: runs inside the test VM during `cargo xtask e2e` and executes shell commands
//! for the tests on the host (what `kubectl exec` would be to a node). The host reaches it through
//! a qemu user-mode port forward on loopback.
//!
//! One request per connection: a JSON line `{"cmd": "…", "stdin": "…"}`; the answer is one JSON
//! object `{"code": N, "out": "…", "err": "…"}` (code -1 when the command died by a signal). A
//! request `{"cmd": "", "poweroff": true}` powers the VM off.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{Ipv4Addr, TcpListener, TcpStream},
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::vm::{self, Disk, Kernel, RunningVm, VmSpec};

/// The guest port of the command server.
pub const GUEST_PORT: u16 = 7000;

/// Boots a VM (user-mode network, `cpus` vCPUs) whose guest runs the command server, reachable at
/// host loopback port `exec_port`, and waits until it answers.
pub fn start_served(
    repo: &Path,
    kernel: &Kernel,
    name: &str,
    disks: Vec<Disk>,
    cpus: u32,
    exec_port: u16,
) -> Result<RunningVm> {
    let xtask = std::env::current_exe().context("the xtask executable")?;
    let spec = VmSpec {
        name: name.into(),
        disks,
        memory_mib: 2048,
        cpus,
        net: true,
        forwards: vec![(exec_port, GUEST_PORT)],
        command: format!(
            "{} guest-serve {GUEST_PORT}",
            vm::shell_quote(&xtask.to_string_lossy())
        ),
        cwd: repo.to_path_buf(),
        env: vec![("RUST_BACKTRACE".into(), "1".into())],
        timeout: Duration::from_secs(60 * 60),
    };
    let vm = vm::start(repo, kernel, spec)?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if exec(exec_port, "true").is_ok_and(|code| code == 0) {
            return Ok(vm);
        }
        if Instant::now() > deadline {
            bail!("the {name} VM's command server did not answer within 300 s");
        }
        thread::sleep(Duration::from_secs(1));
    }
}

/// Runs `cmd` in the VM behind `port`; its exit code.
pub fn exec(port: u16, cmd: &str) -> Result<i64> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    writeln!(stream, "{}", serde_json::json!({ "cmd": cmd }))?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    let reply: serde_json::Value = serde_json::from_str(&reply)?;
    reply["code"].as_i64().context("no exit code in the reply")
}

/// Asks the VM behind `port` to power off.
pub fn poweroff(port: u16) {
    if let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
        let _ = writeln!(
            stream,
            "{}",
            serde_json::json!({"cmd": "", "poweroff": true})
        );
    }
}

pub fn serve(port: u16) -> Result<()> {
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
        .with_context(|| format!("listening on port {port}"))?;
    println!("guest-serve: listening on {port}");
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        thread::spawn(move || {
            if let Err(e) = answer(stream) {
                eprintln!("guest-serve: {e:#}");
            }
        });
    }
    Ok(())
}

fn answer(stream: TcpStream) -> Result<()> {
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let req: serde_json::Value = serde_json::from_str(&line).context("a JSON request line")?;
    if req["poweroff"] == true {
        let _ = Command::new("sync").status();
        std::fs::write("/proc/sysrq-trigger", "o")?;
        return Ok(());
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
    let reply = serde_json::json!({
        "code": out.status.code().unwrap_or(-1),
        "out": String::from_utf8_lossy(&out.stdout),
        "err": String::from_utf8_lossy(&out.stderr),
    });
    (&stream).write_all(serde_json::to_string(&reply)?.as_bytes())?;
    Ok(())
}
