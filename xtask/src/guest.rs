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

/// `xtask guest-connect PORT`: an HTTP CONNECT proxy in the test node, through which the API server
/// on the host dials pod and node addresses (its egress selector's `cluster` connection: admission
/// webhooks behind Services, kubelet's logs and exec), as konnectivity's agent would. One tunnel
/// per connection; only private (10.0.0.0/8) destinations.
pub fn serve_connect(port: u16) -> Result<()> {
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
        .with_context(|| format!("listening on port {port}"))?;
    println!("guest-connect: listening on {port}");
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        thread::spawn(move || {
            if let Err(e) = tunnel(stream) {
                eprintln!("guest-connect: {e:#}");
            }
        });
    }
    Ok(())
}

/// The `host:port` of a `CONNECT host:port HTTP/1.1` request line, if it names a 10/8 address.
fn connect_target(request_line: &str) -> Option<std::net::SocketAddrV4> {
    let mut words = request_line.split_whitespace();
    if words.next() != Some("CONNECT") {
        return None;
    }
    let addr: std::net::SocketAddrV4 = words.next()?.parse().ok()?;
    (addr.ip().octets()[0] == 10).then_some(addr)
}

fn tunnel(client: TcpStream) -> Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // The headers, up to the blank line.
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
    }
    let mut client_w = client.try_clone()?;
    let Some(target) = connect_target(&request) else {
        client_w.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n")?;
        bail!("refused {:?}", request.trim());
    };
    let upstream = match TcpStream::connect_timeout(&target.into(), Duration::from_secs(10)) {
        Ok(s) => s,
        Err(e) => {
            client_w.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")?;
            bail!("connecting {target}: {e}");
        }
    };
    client_w.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?;
    // Whatever the client sent after the headers is already in the reader's buffer.
    let buffered = reader.buffer().to_vec();
    let mut up_w = upstream.try_clone()?;
    up_w.write_all(&buffered)?;
    let mut up_r = upstream;
    let down = thread::spawn(move || {
        let _ = std::io::copy(&mut up_r, &mut client_w);
        let _ = client_w.shutdown(std::net::Shutdown::Write);
    });
    let mut client_r = reader.into_inner();
    let _ = std::io::copy(&mut client_r, &mut up_w);
    let _ = up_w.shutdown(std::net::Shutdown::Write);
    let _ = down.join();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_targets_are_private_addresses_only() {
        assert_eq!(
            connect_target("CONNECT 10.88.0.5:9443 HTTP/1.1\r\n"),
            Some("10.88.0.5:9443".parse().unwrap())
        );
        assert_eq!(connect_target("CONNECT 192.168.1.1:443 HTTP/1.1"), None);
        assert_eq!(connect_target("GET / HTTP/1.1"), None);
        assert_eq!(connect_target("CONNECT lvms-node:10250 HTTP/1.1"), None);
    }
}
