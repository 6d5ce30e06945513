//! The guests' servers and how a task boots a served guest: `xtask guest-serve` runs the command
//! server of [`lvms_testkit::guest`] in the VM (one protocol and one client for every test and
//! task), and `xtask guest-connect` the API server's HTTP CONNECT proxy in each of the installed
//! test's nodes.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, TcpListener, TcpStream},
    path::Path,
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use lvms_testkit::guest::Guest;

use crate::vm::{self, Disk, Kernel, RunningVm, VmSpec};

/// The guest port of the command server.
pub const GUEST_PORT: u16 = 7000;

/// Boots a VM (user-mode network, `cpus` vCPUs) whose guest runs the command server, reachable at
/// host loopback port `exec_port`, and waits until it answers; `more_forwards` are further
/// `(host loopback port, guest port)` forwards.
pub fn start_served(
    repo: &Path,
    kernel: &Kernel,
    name: &str,
    disks: Vec<Disk>,
    cpus: u32,
    exec_port: u16,
    more_forwards: &[(u16, u16)],
) -> Result<RunningVm> {
    let xtask = std::env::current_exe().context("the xtask executable")?;
    let command = format!(
        "{} guest-serve {GUEST_PORT}",
        vm::shell_quote(&xtask.to_string_lossy())
    );
    let spec = VmSpec::new(name, repo, command)
        .disks(disks)
        .cpus(cpus)
        .net(
            std::iter::once((exec_port, GUEST_PORT))
                .chain(more_forwards.iter().copied())
                .collect(),
        )
        .env("RUST_BACKTRACE", "1");
    let vm = vm::start(repo, kernel, spec)?;
    Guest::new(name, format!("127.0.0.1:{exec_port}")).wait_ready(Duration::from_secs(300))?;
    Ok(vm)
}

/// The command server a task booted, on host loopback `port`.
pub fn at(port: u16) -> Guest {
    Guest::new("guest", format!("127.0.0.1:{port}"))
}

/// `xtask guest-serve PORT`.
pub fn serve(port: u16) -> Result<()> {
    lvms_testkit::guest::serve(port).with_context(|| format!("serving on port {port}"))
}

/// `xtask guest-connect PORT`: an HTTP CONNECT proxy in a test node, through which the API server
/// on the host dials that node's pod and node addresses (its egress selector's `cluster`
/// connection: admission webhooks behind Services, kubelet's logs and exec), as konnectivity's
/// agent would; the host picks the node by the address (`crate::node`). One tunnel per connection;
/// only private (10.0.0.0/8) destinations.
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
    upstream.try_clone()?.write_all(&buffered)?;
    crate::relay::join(reader.into_inner(), upstream);
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
