//! Host-to-guest TCP ports for user-mode Linux guests, over connections the guest opens (ADR 0027).
//!
//! A user-mode guest's network is slirp: the guest reaches the host's loopback at 10.0.2.2, but
//! nothing on the host reaches the guest (slirp's port redirection accepted no connection here).
//! So the guest dials out: `xtask guest-relay 10.0.2.2:PORT` in the guest keeps a control
//! connection to the host's [`Relay`]; a client that connects to a forwarded host loopback port is
//! announced on it (`open ID GUEST_PORT`), the guest dials a data connection (`data ID`) and joins
//! it to the guest port. What qemu's `hostfwd` does, on the user-mode network, loopback only.

use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{Ipv4Addr, Shutdown, TcpListener, TcpStream},
    sync::{
        Arc, Condvar, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};

/// How long a client waits for the guest's control connection (the guest is still booting).
const CONTROL_WAIT: Duration = Duration::from_secs(300);

/// The guest's control connection.
#[derive(Default)]
enum Control {
    /// Not yet (the guest is booting): clients wait for it.
    #[default]
    Waiting,
    Up(TcpStream),
    /// It ended (the guest is gone): clients are closed at once, as if refused.
    Gone,
}

/// The host's side: the forwarded ports and the port the guest dials.
pub struct Relay {
    port: u16,
    ports: Vec<u16>,
    stop: Arc<AtomicBool>,
}

#[derive(Default)]
struct State {
    control: Mutex<Control>,
    control_up: Condvar,
    pending: Mutex<HashMap<u64, TcpStream>>,
    next: AtomicU64,
}

impl Relay {
    /// Listens on host loopback: each `(host, guest)` forward's host port, and a free port for the
    /// guest's connections ([`Relay::port`]).
    pub fn start(forwards: &[(u16, u16)]) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(State::default());
        let guest_side = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = guest_side.local_addr()?.port();
        let mut ports = vec![port];
        let mut listeners = Vec::new();
        for &(host, guest) in forwards {
            let l = TcpListener::bind((Ipv4Addr::LOCALHOST, host))
                .with_context(|| format!("forwarding host loopback port {host}: it is taken"))?;
            ports.push(host);
            listeners.push((l, guest));
        }
        {
            let (state, stop) = (state.clone(), stop.clone());
            thread::spawn(move || accept_guest(&guest_side, &state, &stop));
        }
        for (l, guest) in listeners {
            let (state, stop) = (state.clone(), stop.clone());
            thread::spawn(move || accept_clients(&l, guest, &state, &stop));
        }
        Ok(Self { port, ports, stop })
    }

    /// The host loopback port the guest dials (10.0.2.2 inside).
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Relay {
    /// Stops listening: each accept loop is woken by a connection and sees the flag.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for p in &self.ports {
            let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, *p));
        }
    }
}

fn accept_guest(listener: &TcpListener, state: &Arc<State>, stop: &AtomicBool) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            if let Control::Up(c) = &*lock(&state.control) {
                let _ = c.shutdown(Shutdown::Both);
            }
            return;
        }
        let Ok(mut conn) = conn else { continue };
        let state = state.clone();
        thread::spawn(move || {
            let Ok(line) = read_line(&mut conn) else {
                return;
            };
            match parse(&line) {
                Some(Message::Control) => {
                    let Ok(watched) = conn.try_clone() else {
                        return;
                    };
                    *lock(&state.control) = Control::Up(conn);
                    state.control_up.notify_all();
                    // The guest sends nothing more: the end of the stream is the guest's end.
                    let _ = std::io::copy(&mut &watched, &mut std::io::sink());
                    let mut control = lock(&state.control);
                    if matches!(&*control, Control::Up(c) if same(c, &watched)) {
                        *control = Control::Gone;
                        lock(&state.pending).clear();
                        state.control_up.notify_all();
                    }
                }
                Some(Message::Data(id)) => {
                    let client = lock(&state.pending).remove(&id);
                    if let Some(client) = client {
                        join(client, conn);
                    }
                }
                _ => eprintln!("relay: unexpected {line:?} from the guest"),
            }
        });
    }
}

fn accept_clients(listener: &TcpListener, guest_port: u16, state: &Arc<State>, stop: &AtomicBool) {
    for client in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let id = state.next.fetch_add(1, Ordering::SeqCst);
        lock(&state.pending).insert(id, client);
        let state = state.clone();
        thread::spawn(move || {
            if announce(&state, id, guest_port).is_err() {
                // No guest to serve it: the client sees its connection closed.
                lock(&state.pending).remove(&id);
            }
        });
    }
}

/// Tells the guest to open `id` to `guest_port`, once its control connection is up.
fn announce(state: &State, id: u64, guest_port: u16) -> Result<()> {
    let control = lock(&state.control);
    let (mut control, _) = state
        .control_up
        .wait_timeout_while(control, CONTROL_WAIT, |c| matches!(c, Control::Waiting))
        .unwrap_or_else(PoisonError::into_inner);
    let Control::Up(c) = &mut *control else {
        bail!("no guest");
    };
    let sent = c.write_all(format!("open {id} {guest_port}\n").as_bytes());
    if sent.is_err() {
        *control = Control::Gone;
    }
    Ok(sent?)
}

/// A lock whose holder panicked is still the state (each change is one assignment).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether two handles are one connection.
fn same(a: &TcpStream, b: &TcpStream) -> bool {
    a.peer_addr().ok() == b.peer_addr().ok() && a.local_addr().ok() == b.local_addr().ok()
}

#[derive(Debug, PartialEq, Eq)]
enum Message {
    Control,
    Data(u64),
    Open(u64, u16),
}

fn parse(line: &str) -> Option<Message> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["control"] => Some(Message::Control),
        ["data", id] => Some(Message::Data(id.parse().ok()?)),
        ["open", id, port] => Some(Message::Open(id.parse().ok()?, port.parse().ok()?)),
        _ => None,
    }
}

/// One line, read a byte at a time: what follows it on the connection is the joined stream's.
fn read_line(conn: &mut TcpStream) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0u8];
    while conn.read(&mut byte)? == 1 {
        if byte[0] == b'\n' {
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
        line.push(byte[0]);
        if line.len() > 256 {
            break;
        }
    }
    Err(std::io::ErrorKind::InvalidData.into())
}

/// Copies both ways until both sides have closed their writing halves.
pub fn join(a: TcpStream, b: TcpStream) {
    let (Ok(mut a_r), Ok(mut b_w)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let there = thread::spawn(move || {
        let _ = std::io::copy(&mut a_r, &mut b_w);
        let _ = b_w.shutdown(Shutdown::Write);
    });
    let (mut b_r, mut a_w) = (b, a);
    let _ = std::io::copy(&mut b_r, &mut a_w);
    let _ = a_w.shutdown(Shutdown::Write);
    let _ = there.join();
}

/// `xtask guest-relay HOST:PORT`, in the guest: keeps the control connection to the host's relay
/// (reconnecting while the host is not there) and joins each announced connection to its guest
/// loopback port.
pub fn serve_guest(host: &str) -> Result<()> {
    loop {
        let Ok(control) = TcpStream::connect(host) else {
            thread::sleep(Duration::from_millis(200));
            continue;
        };
        let mut w = control.try_clone()?;
        w.write_all(b"control\n")?;
        for line in BufReader::new(control).lines() {
            let Ok(line) = line else { break };
            let Some(Message::Open(id, port)) = parse(&line) else {
                eprintln!("guest-relay: unexpected {line:?}");
                continue;
            };
            let host = host.to_owned();
            thread::spawn(move || {
                if let Err(e) = open(&host, id, port) {
                    eprintln!("guest-relay: connection {id} to port {port}: {e:#}");
                }
            });
        }
        thread::sleep(Duration::from_millis(200));
    }
}

fn open(host: &str, id: u64, port: u16) -> Result<()> {
    let mut data = TcpStream::connect(host)?;
    data.write_all(format!("data {id}\n").as_bytes())?;
    // Nothing listening: the host's client sees its connection closed, as with qemu's hostfwd.
    let local = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    join(local, data);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo_server() -> u16 {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        thread::spawn(move || {
            for s in l.incoming().map_while(Result::ok) {
                thread::spawn(move || {
                    let mut w = s.try_clone().unwrap();
                    for line in BufReader::new(s).lines().map_while(Result::ok) {
                        w.write_all(format!("echo {line}\n").as_bytes()).unwrap();
                    }
                });
            }
        });
        port
    }

    fn free_port() -> u16 {
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn talk(port: u16, words: &[&str]) -> Vec<String> {
        let s = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        words
            .iter()
            .map(|word| {
                w.write_all(format!("{word}\n").as_bytes()).unwrap();
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                line.trim_end().to_owned()
            })
            .collect()
    }

    #[test]
    fn a_client_of_a_forwarded_port_talks_to_the_guest_port_over_connections_the_guest_opened() {
        let guest_port = echo_server();
        let host_port = free_port();
        let relay = Relay::start(&[(host_port, guest_port)]).unwrap();
        // A client that comes before the guest's relay waits for it.
        let early = thread::spawn(move || talk(host_port, &["early"]));
        thread::sleep(Duration::from_millis(300));
        let target = format!("127.0.0.1:{}", relay.port());
        thread::spawn(move || serve_guest(&target));
        assert_eq!(early.join().unwrap(), ["echo early"]);
        // Several at once, each its own stream.
        let clients: Vec<_> = (0..4)
            .map(|i| thread::spawn(move || talk(host_port, &[&format!("a{i}"), &format!("b{i}")])))
            .collect();
        for (i, c) in clients.into_iter().enumerate() {
            assert_eq!(
                c.join().unwrap(),
                [format!("echo a{i}"), format!("echo b{i}")]
            );
        }
        drop(relay);
        thread::sleep(Duration::from_millis(200));
        assert!(
            TcpStream::connect((Ipv4Addr::LOCALHOST, host_port)).is_err(),
            "a dropped relay no longer listens"
        );
    }

    #[test]
    fn a_forward_to_a_guest_port_nobody_listens_on_closes_the_client() {
        let host_port = free_port();
        let closed = free_port();
        let relay = Relay::start(&[(host_port, closed)]).unwrap();
        let target = format!("127.0.0.1:{}", relay.port());
        thread::spawn(move || serve_guest(&target));
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, host_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(s.read(&mut buf).unwrap(), 0, "end of stream");
    }

    #[test]
    fn once_the_guest_is_gone_a_client_is_closed_at_once() {
        let host_port = free_port();
        let relay = Relay::start(&[(host_port, echo_server())]).unwrap();
        // A guest's control connection that ends, as a killed guest's does.
        let mut control = TcpStream::connect((Ipv4Addr::LOCALHOST, relay.port())).unwrap();
        control.write_all(b"control\n").unwrap();
        thread::sleep(Duration::from_millis(200));
        drop(control);
        thread::sleep(Duration::from_millis(200));
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, host_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(s.read(&mut buf).unwrap(), 0, "closed, not left waiting");
    }

    #[test]
    fn messages_parse_and_nothing_else_does() {
        assert_eq!(parse("control"), Some(Message::Control));
        assert_eq!(parse("data 7"), Some(Message::Data(7)));
        assert_eq!(parse("open 3 7000"), Some(Message::Open(3, 7000)));
        assert_eq!(parse("open 3 70000"), None);
        assert_eq!(parse("GET / HTTP/1.1"), None);
    }

    #[test]
    fn a_taken_host_port_is_an_error_naming_it() {
        let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let err = Relay::start(&[(port, 1)]).err().unwrap();
        assert!(format!("{err:#}").contains(&port.to_string()), "{err:#}");
    }
}
