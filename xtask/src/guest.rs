//! `xtask guest-serve`: runs inside the test VM during `cargo xtask e2e` and executes shell commands
//! for the tests on the host (what `kubectl exec` would be to a node). The host reaches it through
//! a qemu user-mode port forward on loopback.
//!
//! One request per connection: a JSON line `{"cmd": "…", "stdin": "…"}`; the answer is one JSON
//! object `{"code": N, "out": "…", "err": "…"}` (code -1 when the command died by a signal). A
//! request `{"cmd": "", "poweroff": true}` powers the VM off.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, TcpListener, TcpStream},
    process::{Command, Stdio},
    thread,
};

use anyhow::{Context, Result};

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
