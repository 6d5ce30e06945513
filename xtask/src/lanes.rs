//! `cargo xtask test`: every suite, as phases run side by side in lanes.
//!
//! Each phase is one process of this program (or of cargo) with its whole output in
//! `target/ci/<phase>.log`. Two run at a time (`--lanes`), most work (known time × load) first,
//! each taken by the lane that frees up first. `prepare` comes first: the workspace's tests built
//! once (`cargo test --workspace --no-run`), the Kubernetes assets unpacked and the VM's initramfs
//! made, so no later phase builds, unpacks or waits on cargo's lock; only `lint` (fmt and clippy,
//! in a target directory of its own) runs beside it, filling the cores the build's serial link
//! steps leave idle. A phase that fails has its log's tail printed at once. At the end: the table
//! of every phase (lane, wall time, CPU time, counts), the total, a warning when the run passed
//! the 45-minute budget, and the counts of every test added up.

use std::{
    collections::VecDeque,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    sync::{Arc, Condvar, Mutex},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};

use crate::{
    artifacts, deps,
    report::Counts,
    turn::{self, Turn},
};

/// What the whole CI run (`.ci/run`) should take at most; past it the run warns.
const BUDGET: Duration = Duration::from_secs(45 * 60);

/// When the whole CI run is stopped: phases still running are killed (with every process under
/// them) and those not started are not run, so the table and the logs' tails are printed well
/// before CI's hard 90-minute limit ends the run with nothing said (stop 49: a run went past it and
/// only the last lines of output were kept, none saying which phase held it).
const RUN_DEADLINE: Duration = Duration::from_secs(78 * 60);

/// What a whole run has taken of the target directory's file system at its fullest, with some
/// room: CI run 24 went from 76.6 to 65.9 GiB free (the guests' disk images, the test build, the
/// Kubernetes assets and the installed nodes' images).
const DISK_NEEDED: u64 = 12 << 30;

/// The longest any one phase may run: two and a half times its known time, at least ten minutes,
/// so a hung phase is killed and named while the others go on.
fn limit(phase: &Phase) -> Duration {
    if phase.name == PREPARE {
        return Duration::from_secs(30 * 60);
    }
    Duration::from_secs((phase.secs.saturating_mul(5) / 2).max(10 * 60))
}

/// `.ci/run` exports the Unix time it started, so the table counts what came before this task
/// (the packages, building xtask) in the total.
const CI_START_ENV: &str = "LVMS_CI_START";

/// How a phase's counts are read from its log.
#[derive(Clone, Copy)]
enum CountsFrom {
    /// libtest's `test result:` lines, added up (cargo test).
    Libtest,
    /// The log's last `…: N passed, N failed, N skipped` line (every xtask task prints one).
    ClosingLine,
    /// No tests (lint).
    None,
}

/// One phase: a process and what its time was last measured at.
pub struct Phase {
    pub name: &'static str,
    /// `xtask` arguments, or cargo's when `cargo` is set.
    args: Vec<String>,
    cargo: bool,
    env: Vec<(&'static str, String)>,
    /// Seconds it takes, measured where a run has measured it and estimated from the sequential CI
    /// otherwise (orders the queue with `load`: most work first).
    secs: u64,
    /// Cores it keeps busy, in hundredths (CPU time ÷ wall time where measured): phases run side
    /// by side only while their loads add up to at most [`CAPACITY`]. A user-mode guest is one CPU
    /// (100 when busy); the two-node tests and the e2e suite, which mostly wait, less.
    load: u32,
    counts: CountsFrom,
    /// Needs what `prepare` builds (every phase but `prepare` and `lint`).
    after_prepare: bool,
    /// Its guests hold sanlock leases on a shared disk image with short I/O timeouts the whole
    /// time: it starts only with the sanlock turn ([`crate::turn`]) taken, and holds it to its end.
    /// (The installed phase takes the turn itself, for its shared-LUN scenario only.)
    sanlock: bool,
}

fn xtask(name: &'static str, secs: u64, load: u32, args: &[&str]) -> Phase {
    Phase {
        name,
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        cargo: false,
        env: Vec::new(),
        secs,
        load,
        counts: CountsFrom::ClosingLine,
        after_prepare: true,
        sanlock: false,
    }
}

/// [`xtask`] of a phase whose guests hold sanlock leases ([`Phase::sanlock`]).
fn sanlock(phase: Phase) -> Phase {
    Phase {
        sanlock: true,
        ..phase
    }
}

/// The machine's cores, in the hundredths of [`Phase::load`]. Under TCG, two two-vCPU guests each
/// ran at half speed or worse and the installed node's kubelet then timed out (ADR 0025); user-mode
/// guests keep a core busy 25–85 % of their time (ADR 0027), so three phases often fit.
const CAPACITY: u32 = 200;

/// The phase that builds what the others need.
const PREPARE: &str = "prepare (build the tests)";

/// Every phase of `cargo xtask test`; nothing that runs is left out of CI. `list` is where
/// `prepare` writes the built tests for the others.
pub fn phases(repo: &Path, list: &Path) -> Vec<Phase> {
    vec![
        Phase {
            counts: CountsFrom::None,
            after_prepare: false,
            // First whatever its time: every phase but lint waits for it.
            ..xtask(
                PREPARE,
                u64::MAX,
                100,
                &["prepare", "--artifacts", &list.display().to_string()],
            )
        },
        Phase {
            // fmt and clippy in a target directory of their own: the check build never waits on
            // (or for) the test build's lock.
            env: vec![(
                "CARGO_TARGET_DIR",
                repo.join("target/lint").display().to_string(),
            )],
            counts: CountsFrom::None,
            after_prepare: false,
            ..xtask("lint (fmt, clippy)", 300, 100, &["lint"])
        },
        Phase {
            args: vec!["test".into(), "--workspace".into()],
            cargo: true,
            counts: CountsFrom::Libtest,
            // 33 s and 24 s of CPU (run of e105b74): it fits beside anything.
            ..xtask("host tests", 33, 50, &[])
        },
        // Times and loads (CPU ÷ wall) from the clean-clone CI run 26 (32a58ff), every guest
        // user-mode (ADR 0027).
        xtask("VM suite 1/2", 533, 60, &["vm-test", "--shard", "1/2"]),
        xtask("VM suite 2/2", 825, 55, &["vm-test", "--shard", "2/2"]),
        sanlock(xtask(
            "two-node: shared classes",
            363,
            60,
            &["vm-shared", "--skip", crate::shared::FENCING_PREFIX],
        )),
        sanlock(xtask(
            "two-node: power loss",
            309,
            25,
            &["vm-shared", "fencing_power_loss"],
        )),
        sanlock(xtask(
            "two-node: lost LUN path",
            218,
            50,
            &["vm-shared", "fencing_a_lost_lun_path"],
        )),
        xtask(
            "csi-sanity: local classes",
            355,
            65,
            &[
                "sanity",
                "--only",
                "thin-mount",
                "--only",
                "thin-block",
                "--only",
                "raid-thin-mount",
                "--only",
                "thick",
            ],
        ),
        xtask(
            "csi-sanity: shared class",
            188,
            55,
            &[
                "sanity",
                "--only",
                "shared-linear-mount",
                "--only",
                "shared-linear-block",
            ],
        ),
        xtask("e2e on a real control plane", 449, 40, &["e2e"]),
        // Two nodes (two user-mode guests): 1586 s in CI run 26 for the four scenarios, most of it
        // waiting on sanlock's host-dead time twice and on the two takeovers' old plugins. Not a
        // sanlock phase: it takes the turn itself for its last scenario, the shared LUN's (677 s),
        // so the two-node phases run beside its first 900 s.
        xtask("installed on two real nodes", 1586, 60, &["installed"]),
    ]
}

/// Most CPU work first (time × load), each to the lane that frees up first: a heavy phase that is
/// hard to place beside others (the installed node's two vCPUs) starts early, beside a light one,
/// rather than last and alone, and the short phases fill the end. (Longest first left the installed
/// node, at 150, waiting until nothing else ran: 10 minutes alone at the end of the run of e4ff72b.)
fn order_by_work(queue: &mut [Phase]) {
    queue.sort_by_key(|p| std::cmp::Reverse(u128::from(p.secs) * u128::from(p.load)));
}

/// What became of one phase.
struct Done {
    name: String,
    lane: String,
    /// When it started, after the run's start.
    started: Duration,
    wall: Duration,
    cpu: Option<Duration>,
    ok: bool,
    /// Why it was killed or not run (`None` when it ran to its end).
    stopped: Option<String>,
    counts: Option<Counts>,
    log: PathBuf,
    /// Free space on the target directory's file system when it ended.
    free: Option<u64>,
}

pub struct Options {
    pub lanes: usize,
    pub vm_cpus: u32,
    /// Only the phases whose name contains one of these (all when empty).
    pub only: Vec<String>,
}

pub fn run(repo: &Path, options: &Options) -> Result<ExitCode> {
    // The packages were checked by `main` before this task; the phases inherit that.
    let started = Instant::now();
    let dir = repo.join("target/ci");
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    let list = dir.join("artifacts.json");
    let exe = std::env::current_exe().context("the xtask executable")?;
    let env: Vec<(&str, String)> = vec![
        (deps::CHECKED_ENV, "1".into()),
        (artifacts::ARTIFACTS_ENV, list.display().to_string()),
        ("LVMS_VM_CPUS", options.vm_cpus.to_string()),
        (turn::ENV, dir.join("sanlock.turn").display().to_string()),
    ];

    let mut queue: Vec<Phase> = phases(repo, &list)
        .into_iter()
        .filter(|p| {
            p.name == PREPARE
                || options.only.is_empty()
                || options.only.iter().any(|o| p.name.contains(o))
        })
        .collect();
    if queue.len() == 1 {
        bail!("--only {:?} names no phase", options.only);
    }
    order_by_work(&mut queue);

    let before = ci_started_before(started);
    let deadline = started + RUN_DEADLINE.saturating_sub(before);
    let disk = DiskWatch::start(repo.join("target"));
    println!(
        "test: {} free on the target directory's file system; phases still running {:.0} min \
         after the run's start are killed",
        gib(disk.first),
        RUN_DEADLINE.as_secs_f64() / 60.0
    );
    if disk.first.is_some_and(|free| free < DISK_NEEDED) {
        println!(
            "test: WARNING: a run has needed about {} of disk (CI run 24: 10.7 \
             GiB); with less, guests see I/O errors and phases fail far from the cause",
            gib(Some(DISK_NEEDED))
        );
    }
    let board = Arc::new(Board {
        queue: Mutex::new(VecDeque::from(queue)),
        running: Mutex::new(0),
        turn: dir.join("sanlock.turn"),
        prepared: Mutex::new(None),
        changed: Condvar::new(),
        done: Mutex::new(Vec::new()),
        deadline,
    });
    let lanes: Vec<_> = (1..=options.lanes.max(1))
        .map(|lane| {
            let board = Arc::clone(&board);
            let (exe, repo, dir, env) = (exe.clone(), repo.to_path_buf(), dir.clone(), env.clone());
            thread::spawn(move || {
                while let Some(next) = board.next() {
                    let (phase, turn) = match next {
                        Next::Run(phase, turn) => (phase, turn),
                        Next::Skip(phase, why) => {
                            let done = Done::not_run(&phase, &dir, why);
                            board.finish(&Phase { load: 0, ..phase }, done);
                            continue;
                        }
                    };
                    println!(
                        "test: [lane {lane}] {} (log {})",
                        phase.name,
                        log_path(&dir, phase.name).display()
                    );
                    let result = run_phase(
                        &exe,
                        &repo,
                        &dir,
                        &phase,
                        &env,
                        &lane.to_string(),
                        started,
                        deadline,
                    );
                    report_done(&result);
                    drop(turn);
                    board.finish(&phase, result);
                }
            })
        })
        .collect();
    for lane in lanes {
        let _ = lane.join();
    }
    let mut results = board
        .done
        .lock()
        .map(|mut d| std::mem::take(&mut *d))
        .unwrap_or_default();
    results.sort_by_key(|r| r.started);

    let disk = disk.stop();
    print!("{}", table(&results, before, started.elapsed() + before));
    println!("{}", disk.line(before));
    let total = started.elapsed() + before;
    if total > BUDGET {
        println!("{}", budget_warning(&results, total));
    }
    let mut counts = Counts::default();
    for r in &results {
        if let Some(c) = r.counts {
            counts.add(c);
        }
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| !r.ok)
        .map(|r| r.name.as_str())
        .collect();
    if !failed.is_empty() {
        println!("test: failed phases: {}", failed.join(", "));
    }
    // The plain closing line, over every phase.
    println!("test: {counts}");
    Ok(if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The lanes' shared state: the phases not started, whether `prepare` succeeded, the results.
struct Board {
    queue: Mutex<VecDeque<Phase>>,
    /// The loads of the phases running now (changed with the queue's lock held).
    running: Mutex<u32>,
    /// The sanlock turn's file ([`crate::turn`]), also named to every phase by [`turn::ENV`].
    turn: PathBuf,
    /// `None` until `prepare` ends, then whether it succeeded.
    prepared: Mutex<Option<bool>>,
    changed: Condvar,
    done: Mutex<Vec<Done>>,
    /// Past it, no phase starts ([`RUN_DEADLINE`]).
    deadline: Instant,
}

enum Next {
    /// Run it; with the sanlock turn when it is a [`Phase::sanlock`] phase, held until it ends.
    Run(Phase, Option<Turn>),
    /// Not run, and why: it needs `prepare`, which failed, or the run's deadline has passed.
    Skip(Phase, &'static str),
}

impl Board {
    /// The first phase in the queue (most work first, a sanlock phase before any other) this lane
    /// may start now: one whose build is done, whose load fits beside the running phases' (any,
    /// when nothing runs) and, for a sanlock phase, whose turn is free; waits until one does.
    /// `None` when the queue is empty.
    fn next(&self) -> Option<Next> {
        let mut queue = self.queue.lock().ok()?;
        loop {
            let prepared = self.prepared.lock().ok().and_then(|p| *p);
            let running = self.running.lock().map(|r| *r).unwrap_or(0);
            let fits = |p: &Phase| {
                (!p.after_prepare || prepared.is_some())
                    && (running == 0 || running + p.load <= CAPACITY)
            };
            // The sanlock phases run one after another: with the installed phase's shared-LUN
            // scenario they are the run's longest chain, so a free lane takes the next of them
            // before anything else (CI run 18: a csi-sanity phase went first and the chain ended 3
            // minutes later, alone). The turn is free here or not at all, so the first that fits
            // is the one to try.
            let mut turn = None;
            let ready = queue
                .iter()
                .position(|p| p.sanlock && fits(p))
                .filter(|&i| {
                    // Skipped (the build failed), it needs no turn.
                    if queue[i].after_prepare && prepared == Some(false) {
                        return true;
                    }
                    match Turn::try_take(&self.turn) {
                        Ok(taken) => {
                            turn = taken;
                            turn.is_some()
                        }
                        // Without the lock nothing can keep the phases apart: run it anyway, and
                        // say so.
                        Err(e) => {
                            println!("test: WARNING: {e:#}");
                            true
                        }
                    }
                })
                .or_else(|| queue.iter().position(|p| !p.sanlock && fits(p)));
            match ready {
                Some(i) => {
                    let phase = queue.remove(i)?;
                    if phase.after_prepare && prepared == Some(false) {
                        return Some(Next::Skip(phase, "not run (the build failed)"));
                    }
                    if Instant::now() >= self.deadline {
                        return Some(Next::Skip(phase, "not run (past the run's deadline)"));
                    }
                    if let Ok(mut r) = self.running.lock() {
                        *r += phase.load;
                    }
                    return Some(Next::Run(phase, turn));
                }
                None if queue.is_empty() => return None,
                // The turn may come back from another process (the installed phase), which
                // nothing here hears: look again every few seconds.
                None => {
                    queue = self
                        .changed
                        .wait_timeout(queue, TURN_POLL)
                        .ok()
                        .map(|(q, _)| q)?;
                }
            }
        }
    }

    fn finish(&self, phase: &Phase, result: Done) {
        if phase.name == PREPARE
            && let Ok(mut p) = self.prepared.lock()
        {
            *p = Some(result.ok);
        }
        if let Ok(mut d) = self.done.lock() {
            d.push(result);
        }
        // Taken with the queue's lock so a lane between its check and its wait hears it.
        let _queue = self.queue.lock();
        if let Ok(mut r) = self.running.lock() {
            *r = r.saturating_sub(phase.load);
        }
        self.changed.notify_all();
    }
}

/// How often a lane waiting for work looks again whether the sanlock turn came back.
const TURN_POLL: Duration = Duration::from_secs(2);

impl Done {
    fn not_run(phase: &Phase, dir: &Path, why: &str) -> Self {
        Done {
            name: phase.name.to_owned(),
            lane: "-".into(),
            started: Duration::MAX,
            wall: Duration::ZERO,
            cpu: None,
            ok: false,
            stopped: Some(why.to_owned()),
            counts: None,
            log: log_path(dir, phase.name),
            free: None,
        }
    }
}

/// The free space on the target directory's file system, read every few seconds while the phases
/// run: CI machines have had only a few GiB free (`.ci/run`), and a full disk shows up as I/O errors
/// inside the guests, far from its cause.
struct DiskWatch {
    first: Option<u64>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    sampler: thread::JoinHandle<Option<(u64, Duration)>>,
    path: PathBuf,
}

/// What [`DiskWatch`] saw.
struct DiskSeen {
    first: Option<u64>,
    lowest: Option<(u64, Duration)>,
    last: Option<u64>,
}

fn free_bytes(path: &Path) -> Option<u64> {
    let v = rustix::fs::statvfs(path).ok()?;
    Some(v.f_bavail.saturating_mul(v.f_frsize))
}

fn gib(bytes: Option<u64>) -> String {
    bytes.map_or_else(
        || "? GiB".into(),
        |b| format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30)),
    )
}

impl DiskWatch {
    fn start(path: PathBuf) -> Self {
        let first = free_bytes(&path);
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let sampler = {
            let (stop, path) = (Arc::clone(&stop), path.clone());
            let started = Instant::now();
            thread::spawn(move || {
                let mut lowest: Option<(u64, Duration)> = None;
                let (lock, cv) = &*stop;
                let mut stopped = lock.lock().ok()?;
                while !*stopped {
                    if let Some(free) = free_bytes(&path)
                        && lowest.is_none_or(|(l, _)| free < l)
                    {
                        lowest = Some((free, started.elapsed()));
                    }
                    stopped = cv.wait_timeout(stopped, Duration::from_secs(5)).ok()?.0;
                }
                lowest
            })
        };
        DiskWatch {
            first,
            stop,
            sampler,
            path,
        }
    }

    fn stop(self) -> DiskSeen {
        if let Ok(mut s) = self.stop.0.lock() {
            *s = true;
        }
        self.stop.1.notify_all();
        DiskSeen {
            first: self.first,
            lowest: self.sampler.join().ok().flatten(),
            last: free_bytes(&self.path),
        }
    }
}

impl DiskSeen {
    /// `before`: how long CI ran before this task, as the table's start column counts.
    fn line(&self, before: Duration) -> String {
        format!(
            "disk: {} free at the start, lowest {}, {} at the end",
            gib(self.first),
            self.lowest.map_or_else(
                || "not read".into(),
                |(b, at)| format!(
                    "{} at {:.1} m",
                    gib(Some(b)),
                    (before + at).as_secs_f64() / 60.0
                )
            ),
            gib(self.last)
        )
    }
}

/// How long `.ci/run` ran before this task started (0 outside CI).
fn ci_started_before(started: Instant) -> Duration {
    let Some(start) = std::env::var(CI_START_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    else {
        return Duration::ZERO;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .saturating_sub(started.elapsed());
    now.saturating_sub(Duration::from_secs(start))
}

fn log_path(dir: &Path, name: &str) -> PathBuf {
    let slug: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .split('-')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("-");
    dir.join(format!("{slug}.log"))
}

#[allow(clippy::too_many_arguments)]
fn run_phase(
    exe: &Path,
    repo: &Path,
    dir: &Path,
    phase: &Phase,
    env: &[(&str, String)],
    lane: &str,
    run_started: Instant,
    deadline: Instant,
) -> Done {
    let log = log_path(dir, phase.name);
    let started = Instant::now();
    let own_limit = limit(phase);
    let (wait, why) = if started + own_limit <= deadline {
        (
            own_limit,
            format!(
                "KILLED at its {:.0}-minute limit",
                own_limit.as_secs_f64() / 60.0
            ),
        )
    } else {
        (
            deadline.saturating_duration_since(started),
            format!(
                "KILLED at the run's {:.0}-minute deadline",
                RUN_DEADLINE.as_secs_f64() / 60.0
            ),
        )
    };
    let mut stopped = None;
    let outcome = (|| -> Result<(bool, Option<Duration>)> {
        let file = fs::File::create(&log)?;
        let mut cmd = if phase.cargo {
            Command::new(env!("CARGO"))
        } else {
            Command::new(exe)
        };
        cmd.args(&phase.args)
            .current_dir(repo)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .envs(phase.env.iter().map(|(k, v)| (*k, v.as_str())));
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", phase.name))?;
        // The watchdog kills the phase and every process under it (guests, control planes) when
        // its time is up; it hears of the phase's exit while the exited phase is still unreaped,
        // so the id it would kill is never another's.
        let (exited, heard) = std::sync::mpsc::channel::<()>();
        let pid = child.id();
        let watchdog = thread::spawn(move || {
            if heard.recv_timeout(wait) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                lvms_testkit::guest::kill_machine(pid);
                true
            } else {
                false
            }
        });
        let cpu = cpu_at_exit(pid);
        let _ = exited.send(());
        if watchdog.join().unwrap_or(false) {
            stopped = Some(why);
        }
        let status = child.wait()?;
        Ok((status.success(), cpu))
    })();
    let (ok, cpu) = match outcome {
        Ok(r) => r,
        Err(e) => {
            let _ = fs::write(&log, format!("xtask: {e:#}\n"));
            (false, None)
        }
    };
    let text = fs::read_to_string(&log).unwrap_or_default();
    let counts = match phase.counts {
        CountsFrom::None => None,
        CountsFrom::Libtest => {
            let lines: Vec<String> = text
                .lines()
                .filter(|l| l.starts_with("test result: "))
                .map(str::to_owned)
                .collect();
            Some(Counts::from_libtest(&lines))
        }
        CountsFrom::ClosingLine => text.lines().rev().find_map(Counts::from_closing_line),
    };
    let failed_tests = counts.is_some_and(|c| c.failed > 0);
    Done {
        name: phase.name.to_owned(),
        lane: lane.to_owned(),
        started: started - run_started,
        wall: started.elapsed(),
        cpu,
        ok: ok && !failed_tests && stopped.is_none(),
        stopped,
        counts,
        log,
        free: free_bytes(dir),
    }
}

/// Blocks until the child `pid` has exited, leaving it to be reaped, and reads the CPU time it
/// and the children it waited for used (`/proc/<pid>/stat` of the zombie).
fn cpu_at_exit(pid: u32) -> Option<Duration> {
    use rustix::process::{Pid, WaitId, WaitIdOptions, waitid};
    let pid = Pid::from_raw(i32::try_from(pid).ok()?)?;
    loop {
        match waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        ) {
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return None,
        }
    }
    let stat = fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).ok()?;
    cpu_from_stat(&stat, rustix::param::clock_ticks_per_second())
}

/// utime + stime + cutime + cstime of a `/proc/<pid>/stat` line, in `ticks` per second.
fn cpu_from_stat(stat: &str, ticks: u64) -> Option<Duration> {
    // The command name (field 2) may hold spaces: count from the closing parenthesis.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state): fields 14..=17 are rest[11..=14].
    let sum: u64 = fields
        .get(11..=14)?
        .iter()
        .map(|f| f.parse::<u64>().ok())
        .sum::<Option<u64>>()?;
    Some(Duration::from_millis(sum * 1000 / ticks.max(1)))
}

fn report_done(d: &Done) {
    println!(
        "test: [lane {}] {}: {} in {:.0} s{}{}",
        d.lane,
        d.name,
        d.result(),
        d.wall.as_secs_f64(),
        d.cpu
            .map(|c| format!(", cpu {:.0} s", c.as_secs_f64()))
            .unwrap_or_default(),
        d.counts.map(|c| format!(": {c}")).unwrap_or_default(),
    );
    if !d.ok {
        let text = fs::read_to_string(&d.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(200)..];
        println!(
            "test: ---- the last {} lines of {} ----",
            tail.len(),
            d.log.display()
        );
        for l in tail {
            println!("{}: {l}", d.name);
        }
        println!("test: ---- end of {} ----", d.name);
    }
}

impl Done {
    /// The table's result column: ok, FAILED, or why it was killed or not run.
    fn result(&self) -> &str {
        match (&self.stopped, self.ok) {
            (Some(why), _) => why,
            (None, true) => "ok",
            (None, false) => "FAILED",
        }
    }
}

fn table(results: &[Done], before: Duration, total: Duration) -> String {
    let mut s = String::from(
        "\nphase                              lane   start    wall     cpu     free  result\n",
    );
    if !before.is_zero() {
        let _ = writeln!(
            s,
            "{:<34} {:>4} {:>7} {:>6.0} s {:>7} {:>8}  packages, building xtask",
            "before `cargo xtask test`",
            "-",
            "",
            before.as_secs_f64(),
            "",
            ""
        );
    }
    for r in results {
        let _ = writeln!(
            s,
            "{:<34} {:>4} {:>7} {:>6.0} s {:>7} {:>8}  {}{}",
            r.name,
            r.lane,
            if r.started == Duration::MAX {
                "-".to_owned()
            } else {
                format!("{:.1} m", (before + r.started).as_secs_f64() / 60.0)
            },
            r.wall.as_secs_f64(),
            r.cpu
                .map(|c| format!("{:.0} s", c.as_secs_f64()))
                .unwrap_or_else(|| "-".into()),
            r.free.map_or_else(|| "-".into(), |b| gib(Some(b))),
            r.result(),
            r.counts.map(|c| format!(": {c}")).unwrap_or_default(),
        );
    }
    let _ = writeln!(
        s,
        "{:<34} {:>4} {:>7} {:>6.0} s ({:.1} min; budget {} min)",
        "total",
        "",
        "",
        total.as_secs_f64(),
        total.as_secs_f64() / 60.0,
        BUDGET.as_secs() / 60
    );
    s
}

fn budget_warning(results: &[Done], total: Duration) -> String {
    let mut slowest: Vec<&Done> = results.iter().collect();
    slowest.sort_by_key(|d| std::cmp::Reverse(d.wall));
    format!(
        "test: WARNING: the run took {:.1} min, over the {}-minute budget; the slowest phases: {}",
        total.as_secs_f64() / 60.0,
        BUDGET.as_secs() / 60,
        slowest
            .iter()
            .take(3)
            .map(|d| format!(
                "{} ({:.0} s, lane {})",
                d.name,
                d.wall.as_secs_f64(),
                d.lane
            ))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// `cargo xtask lint`: what CI requires of the code's form.
pub fn lint(repo: &Path) -> Result<ExitCode> {
    for args in [
        &["fmt", "--all", "--", "--check"][..],
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ][..],
    ] {
        let status = Command::new(env!("CARGO"))
            .args(args)
            .current_dir(repo)
            .status()?;
        if !status.success() {
            bail!("cargo {} failed", args.join(" "));
        }
    }
    println!("lint: fmt and clippy clean");
    Ok(ExitCode::SUCCESS)
}

/// `cargo xtask prepare`: what every phase of `test` would otherwise do first, each on its own.
pub fn prepare(repo: &Path, list: &Path) -> Result<()> {
    let started = std::time::Instant::now();
    artifacts::Artifacts::build(repo, std::process::Stdio::inherit())?.save(list)?;
    println!(
        "prepare: tests built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    crate::cluster::assets(repo, crate::cluster::CONTROL_PLANE)?;
    crate::vm::prepare(repo)?;
    println!("prepare: done in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(name: &str, secs: u64) -> Done {
        Done {
            name: name.into(),
            lane: "1".into(),
            started: Duration::ZERO,
            wall: Duration::from_secs(secs),
            cpu: None,
            ok: true,
            stopped: None,
            counts: None,
            log: PathBuf::new(),
            free: Some(3 << 29),
        }
    }

    /// A turn file of the test's own.
    fn turn_path(test: &str) -> PathBuf {
        std::env::temp_dir().join(format!("lanes-turn-{}-{test}", std::process::id()))
    }

    fn board(phases: Vec<Phase>, prepared: Option<bool>) -> Board {
        let test = phases.iter().map(|p| p.name).collect::<Vec<_>>().join("-");
        Board {
            queue: Mutex::new(VecDeque::from(phases)),
            running: Mutex::new(0),
            turn: turn_path(&test.replace([' ', '/'], "_")),
            prepared: Mutex::new(prepared),
            changed: Condvar::new(),
            done: Mutex::new(Vec::new()),
            deadline: Instant::now() + Duration::from_secs(3600),
        }
    }

    fn name(next: Option<Next>) -> &'static str {
        match next {
            Some(Next::Run(p, _)) => p.name,
            Some(Next::Skip(p, why)) => {
                assert!(p.after_prepare);
                assert_eq!(why, "not run (the build failed)");
                "skipped"
            }
            None => "none",
        }
    }

    #[test]
    fn phases_are_ordered_by_their_work_with_the_build_first() {
        let mut queue = vec![
            xtask("one core, longer", 520, 100, &[]),
            xtask("two vCPUs", 400, 150, &[]),
            xtask(PREPARE, u64::MAX, 100, &[]),
            xtask("light", 430, 50, &[]),
        ];
        order_by_work(&mut queue);
        let names: Vec<&str> = queue.iter().map(|p| p.name).collect();
        assert_eq!(names, [PREPARE, "two vCPUs", "one core, longer", "light"]);
    }

    #[test]
    fn a_busy_phase_runs_only_beside_phases_that_fit_its_load() {
        let b = board(
            vec![
                xtask("heavy", 600, 170, &[]),
                xtask("medium", 500, 70, &[]),
                xtask("light", 300, 30, &[]),
            ],
            Some(true),
        );
        assert_eq!(name(b.next()), "heavy");
        // 170 + 70 is over the two cores: the longer medium phase waits, the light one fits.
        assert_eq!(name(b.next()), "light");
        let heavy = xtask("heavy", 600, 170, &[]);
        b.finish(&heavy, done("heavy", 600));
        assert_eq!(name(b.next()), "medium");
        assert_eq!(name(b.next()), "none");
        assert_eq!(b.done.lock().unwrap().len(), 1);
    }

    #[test]
    fn phases_with_sanlock_leases_never_run_side_by_side() {
        let b = board(
            vec![
                sanlock(xtask("two-node shared", 900, 80, &[])),
                sanlock(xtask("two-node power loss", 300, 50, &[])),
                xtask("VM suite", 600, 70, &[]),
            ],
            Some(true),
        );
        let Some(Next::Run(first, Some(turn))) = b.next() else {
            panic!("the first sanlock phase starts with the turn");
        };
        assert_eq!(first.name, "two-node shared");
        // The other sanlock phase fits the cores but waits for the first one's turn.
        assert_eq!(name(b.next()), "VM suite");
        b.finish(&xtask("VM suite", 600, 70, &[]), done("VM suite", 600));
        let waiting = std::thread::scope(|s| {
            let lane = s.spawn(|| name(b.next()));
            std::thread::sleep(Duration::from_millis(50));
            assert!(!lane.is_finished(), "it waited while the other ran");
            drop(turn);
            b.finish(&first, done(first.name, 900));
            lane.join().unwrap()
        });
        assert_eq!(waiting, "two-node power loss");
        assert_eq!(name(b.next()), "none");
    }

    #[test]
    fn a_sanlock_phase_waits_while_another_process_holds_the_turn() {
        let b = board(
            vec![
                sanlock(xtask("two-node lost path", 200, 50, &[])),
                xtask("e2e", 400, 40, &[]),
            ],
            Some(true),
        );
        // The installed phase, in its shared-LUN scenario.
        let installed = Turn::try_take(&b.turn).unwrap().expect("a free turn");
        assert_eq!(name(b.next()), "e2e");
        let waited = std::thread::scope(|s| {
            let lane = s.spawn(|| {
                let asked = Instant::now();
                let next = name(b.next());
                (next, asked.elapsed())
            });
            std::thread::sleep(Duration::from_millis(300));
            assert!(
                !lane.is_finished(),
                "it waited for the other process's turn"
            );
            // Given back with no word to the lanes, as a process's exit gives it back.
            drop(installed);
            lane.join().unwrap()
        });
        assert_eq!(waited.0, "two-node lost path");
        assert!(waited.1 < TURN_POLL * 3, "took {:?}", waited.1);
    }

    #[test]
    fn a_free_lane_takes_the_next_sanlock_phase_before_heavier_work() {
        let b = board(
            vec![
                xtask("csi-sanity", 200, 110, &[]),
                sanlock(xtask("two-node", 290, 60, &[])),
                xtask("light", 30, 20, &[]),
            ],
            Some(true),
        );
        assert_eq!(name(b.next()), "two-node");
        assert_eq!(name(b.next()), "csi-sanity");
    }

    #[test]
    fn phases_wait_for_the_build_and_are_skipped_when_it_failed() {
        let mut built = xtask("needs the build", 600, 50, &[]);
        built.after_prepare = true;
        let mut lint = xtask("lint", 300, 50, &[]);
        lint.after_prepare = false;
        let b = board(vec![built, lint], None);
        // The build has not ended: only lint may start.
        assert_eq!(name(b.next()), "lint");
        *b.prepared.lock().unwrap() = Some(false);
        assert_eq!(name(b.next()), "skipped");
        assert_eq!(name(b.next()), "none");
    }

    #[test]
    fn no_phase_starts_past_the_runs_deadline() {
        let mut b = board(vec![xtask("late", 60, 50, &[])], Some(true));
        b.deadline = Instant::now();
        match b.next() {
            Some(Next::Skip(p, why)) => {
                assert_eq!(p.name, "late");
                assert_eq!(why, "not run (past the run's deadline)");
            }
            _ => panic!("a phase started past the deadline"),
        }
    }

    #[test]
    fn a_phase_running_at_the_deadline_is_killed_with_the_processes_under_it() {
        let dir = std::env::temp_dir().join(format!("lanes-watchdog-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("grandchild");
        let script = format!(
            "sleep 300 & echo $! > {}; echo started; wait",
            pidfile.display()
        );
        let phase = xtask("hangs", 60, 50, &["-c", &script]);
        let started = Instant::now();
        let done = run_phase(
            Path::new("/bin/sh"),
            &dir,
            &dir,
            &phase,
            &[],
            "1",
            started,
            started + Duration::from_secs(2),
        );
        assert!(started.elapsed() < Duration::from_secs(60), "it was killed");
        assert!(!done.ok);
        assert_eq!(
            done.result(),
            "KILLED at the run's 78-minute deadline",
            "{:?}",
            done.stopped
        );
        let grandchild: u32 = fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Gone, or a zombie waiting for whoever reaps orphans here, once SIGKILL is delivered: a
        // loaded machine can show it running a moment after the kill (CI run 27: state R, its
        // parent already gone).
        let gone = || {
            let stat = fs::read_to_string(format!("/proc/{grandchild}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .map(|(_, r)| r.trim_start().chars().next());
            (stat.is_empty() || state == Some(Some('Z')), stat)
        };
        let killed = Instant::now();
        while !gone().0 && killed.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(50));
        }
        let (gone, stat) = gone();
        assert!(
            gone,
            "the phase's child still runs 5 s after the kill: {stat}"
        );
        let t = table(&[done], Duration::ZERO, Duration::from_secs(3));
        assert!(t.contains("KILLED at the run's 78-minute deadline"), "{t}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_phase_is_limited_to_two_and_a_half_times_its_known_time_and_at_least_ten_minutes() {
        assert_eq!(
            limit(&xtask("installed", 1200, 80, &[])),
            Duration::from_secs(3000)
        );
        assert_eq!(
            limit(&xtask("host tests", 33, 50, &[])),
            Duration::from_secs(600)
        );
        assert_eq!(
            limit(&xtask(PREPARE, u64::MAX, 100, &[])),
            Duration::from_secs(1800)
        );
    }

    #[test]
    fn cpu_time_is_read_from_a_zombies_stat_line() {
        // pid (comm with spaces) state ppid pgrp session tty tpgid flags minflt cminflt majflt
        // cmajflt utime stime cutime cstime …
        let stat = "42 (x task (1)) Z 1 42 42 0 -1 4194560 10 20 0 0 150 50 1000 300 20 0 1 0";
        assert_eq!(cpu_from_stat(stat, 100), Some(Duration::from_secs(15)));
        assert_eq!(cpu_from_stat("garbage", 100), None);
    }

    #[test]
    fn phase_logs_are_named_after_the_phase() {
        assert_eq!(
            log_path(Path::new("/t"), "VM suite 1/2"),
            PathBuf::from("/t/vm-suite-1-2.log")
        );
        assert_eq!(
            log_path(Path::new("/t"), "lint (fmt, clippy)"),
            PathBuf::from("/t/lint-fmt-clippy.log")
        );
    }

    #[test]
    fn the_budget_warning_names_the_slowest_phases_first() {
        let results = [
            done("a", 100),
            done("b", 900),
            done("c", 500),
            done("d", 50),
        ];
        let w = budget_warning(&results, Duration::from_secs(47 * 60));
        assert!(w.contains("47.0 min"), "{w}");
        let (b, c, a) = (
            w.find("b (900 s").unwrap(),
            w.find("c (500 s").unwrap(),
            w.find("a (100 s").unwrap(),
        );
        assert!(b < c && c < a, "{w}");
        assert!(!w.contains("d (50"), "{w}");
    }

    #[test]
    fn every_phase_has_its_own_log_and_the_table_lists_each() {
        let repo = Path::new("/r");
        let all = phases(repo, Path::new("/r/list"));
        let mut logs: Vec<PathBuf> = all.iter().map(|p| log_path(repo, p.name)).collect();
        logs.sort();
        logs.dedup();
        assert_eq!(logs.len(), all.len());
        let results: Vec<Done> = all.iter().map(|p| done(p.name, p.secs.min(9999))).collect();
        let t = table(&results, Duration::from_secs(60), Duration::from_secs(2000));
        for p in &all {
            assert!(t.contains(p.name), "{t}");
        }
        assert!(t.contains("before `cargo xtask test`"), "{t}");
        assert!(
            t.contains("1.5 GiB"),
            "the free space at each phase's end: {t}"
        );
        assert!(t.contains("33.3 min"), "{t}");
    }
}
