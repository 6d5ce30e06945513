//! `Lvm` over [`LvmShell`] against real LVM, inside the test VM (ADR 0002): the same operations and the
//! same error classification as over separate processes, the shell's process handling (timeout, death,
//! devices that appear later, commands it cannot take), and the speed-up it exists for.
//!
//! Each test builds its own loop disks (`Scratch`) and volume groups, and its own shell (a tokio process
//! belongs to the runtime it was started in, and every `#[tokio::test]` has its own). Run with
//! `cargo xtask vm-test vm_shell`; on the host every test shows as ignored.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod vm_shell {
    use std::time::{Duration, Instant};

    use lvms_host::{
        Error,
        lvm::{Lvm, PoolSize, ThinPoolSpec, classify},
        runner::{Command, RealRunner, Runner},
        shell::{LvmShell, MAX_WORDS},
    };
    use lvms_testkit::{Scratch, sh, sh_status};

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn shell_lvm() -> Lvm<LvmShell> {
        Lvm::new(LvmShell::new())
    }

    /// Whether an error is the expected variant.
    type Expect = fn(&Error) -> bool;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn pool(vg: &str, size: u64) -> ThinPoolSpec {
        ThinPoolSpec {
            vg: vg.to_owned(),
            name: "pool".to_owned(),
            size: PoolSize::Bytes(size),
            chunk_size: None,
            metadata_size: None,
            zero: false,
        }
    }

    /// A volume group with a 512 MiB thin pool `pool`, made with `lvm` processes, removed when `s` drops.
    fn sh_vg_with_pool(s: &mut Scratch, disk: &str) -> String {
        let vg = s.vg_name();
        sh(&format!("lvm vgcreate -q {vg} {disk} 2>&1"));
        sh(&format!(
            "lvm lvcreate -q -y --type thin-pool -L 512m -n pool {vg} 2>&1"
        ));
        vg
    }

    /// Waits until `pid` has exited (gone, or a zombie).
    fn wait_gone(pid: u32) {
        for _ in 0..500 {
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => return,
                Ok(s) if s.rsplit(") ").next().is_some_and(|r| r.starts_with('Z')) => return,
                Ok(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        panic!("process {pid} is still running");
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn pv_vg_thin_pool_and_tagged_thin_volumes_in_one_shell_process() {
        let mut s = Scratch::new(1, 1024);
        let d = s.disks[0].clone();
        let vg = s.vg_name();
        let lvm = shell_lvm();

        // Physical volume and volume group: separate processes (device commands).
        lvm.pv_create(&d, None).await.unwrap();
        lvm.vg_create(&vg, std::slice::from_ref(&d), &strings(&["lvms"]))
            .await
            .unwrap();
        assert_eq!(lvm.runner().pid().await, None);
        lvm.thin_pool_create(&pool(&vg, 512 * MIB)).await.unwrap();
        let pid = lvm.runner().pid().await.expect("a shell runs");
        // Every character LVM allows in a tag, and a leading '#' (a comment to the shell unless quoted).
        let tags = strings(&["#leading-hash", "a+b.c-d/e=f!g:h&i#j", "_under:score", "x"]);
        lvm.thin_lv_create(&vg, "pool", "thin1", GIB, &tags)
            .await
            .unwrap();
        lvm.lv_add_tag(&vg, "thin1", "#added").await.unwrap();
        lvm.lv_del_tag(&vg, "thin1", "x").await.unwrap();

        let vgs = lvm.vgs().await.unwrap();
        let v = vgs.iter().find(|v| v.name == vg).expect("vg listed");
        assert_eq!(v.tags, ["lvms"]);
        let lvs = lvm.lvs(Some(&vg)).await.unwrap();
        let names: Vec<&str> = lvs.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["pool", "thin1"]);
        let thin = &lvs[1];
        assert_eq!(thin.segtype, "thin");
        assert_eq!(thin.pool_lv.as_deref(), Some("pool"));
        assert_eq!(thin.size, GIB);
        let mut got = thin.tags.clone();
        got.sort();
        let mut want = strings(&[
            "#added",
            "#leading-hash",
            "a+b.c-d/e=f!g:h&i#j",
            "_under:score",
        ]);
        want.sort();
        assert_eq!(got, want);
        // Independently, through a separate process.
        let independent = sh(&format!("lvm lvs --noheadings -o lv_tags {vg}/thin1"));
        assert_eq!(independent.trim(), want.join(","));
        assert!(
            lvm.pvs()
                .await
                .unwrap()
                .iter()
                .any(|pv| pv.name == d && pv.vg_name.as_deref() == Some(vg.as_str()))
        );

        assert_eq!(
            lvm.runner().pid().await,
            Some(pid),
            "one process did it all"
        );
        assert_eq!(lvm.runner().fallback_reason().await, None);
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn failing_commands_give_the_output_and_error_a_separate_process_gives() {
        let mut s = Scratch::new(2, 1024);
        let (d, ext4) = (s.disks[0].clone(), s.disks[1].clone());
        let vg = sh_vg_with_pool(&mut s, &d);
        sh(&format!(
            "lvm lvcreate -q -y --type thin -V 64m --thinpool pool -n thin1 {vg} 2>&1"
        ));
        sh(&format!("mkfs.ext4 -q {ext4}"));
        let shell = LvmShell::new();

        let thin1 = format!(
            "lvcreate --yes --type thin --virtualsize 1073741824b --thinpool pool --name thin1 {vg}"
        );
        let missing = format!("lvremove --yes {vg}/missing");
        let no_vg = "vgs --reportformat json --units b --nosuffix -o vg_name nosuchvg".to_owned();
        let big = format!("lvcreate --yes --type linear --size 107374182400b --name big {vg}");
        let signature = format!("pvcreate {ext4}");
        let remove_vg = format!("vgremove {vg}");
        let cases: [(&str, Expect); 6] = [
            (&thin1, |e| matches!(e, Error::AlreadyExists(_))),
            (&missing, |e| matches!(e, Error::NotFound(_))),
            (&no_vg, |e| matches!(e, Error::NotFound(_))),
            (&big, |e| matches!(e, Error::InsufficientSpace(_))),
            (
                &signature,
                |e| matches!(e, Error::SignatureExists { signature, .. } if signature == "ext4"),
            ),
            // Asks "Do you really want to remove volume group ...?": answered "n" by both.
            (&remove_vg, |e| matches!(e, Error::InUse(_))),
        ];
        for (line, expected) in cases {
            let cmd = Command::new("lvm", line.split(' '));
            let real = RealRunner.run(&cmd).await.unwrap();
            let via = shell.run(&cmd).await.unwrap();
            println!("{line}\n  process: {real:?}\n  shell:   {via:?}");
            assert_eq!(via.code, real.code, "{line}");
            assert_eq!(via.stderr, real.stderr, "{line}");
            let (real_err, via_err) = (classify(&cmd, real), classify(&cmd, via));
            assert!(expected(&via_err), "{line}: {via_err:?}");
            assert_eq!(via_err.to_string(), real_err.to_string());
        }
        // An unknown option: getopt's complaint and LVM's error, without the usage hint a process adds.
        let cmd = Command::new("lvm", ["lvcreate", "--no-such-option"]);
        let (real, via) = (
            RealRunner.run(&cmd).await.unwrap(),
            shell.run(&cmd).await.unwrap(),
        );
        println!("lvcreate --no-such-option\n  process: {real:?}\n  shell:   {via:?}");
        assert_eq!((via.code, real.code), (Some(3), Some(3)));
        for line in via.stderr.lines() {
            assert!(
                real.stderr.contains(line),
                "{line:?} not in {:?}",
                real.stderr
            );
        }

        // The same through the Lvm API.
        let lvm = Lvm::new(shell);
        let err = lvm
            .thin_lv_create(&vg, "pool", "thin1", GIB, &[])
            .await
            .unwrap_err();
        assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
        lvm.lv_remove(&vg, "missing").await.unwrap();
        assert!(lvm.vg("nosuchvg").await.unwrap().is_none());
        // Still the first shell.
        assert!(lvm.runner().pid().await.is_some());
        assert_eq!(lvm.runner().fallback_reason().await, None);
        let err = lvm.pv_create(&ext4, None).await.unwrap_err();
        assert!(
            matches!(&err, Error::SignatureExists { device, signature } if *device == ext4 && signature == "ext4"),
            "{err:?}"
        );
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn a_command_past_its_timeout_kills_the_shell_and_the_next_starts_another() {
        let mut s = Scratch::new(1, 1024);
        let d = s.disks[0].clone();
        let vg = sh_vg_with_pool(&mut s, &d);
        let lvm = shell_lvm().with_timeout(Duration::from_secs(5));
        assert!(lvm.vg(&vg).await.unwrap().is_some());
        let pid = lvm.runner().pid().await.unwrap();

        // Hold the volume group's lock, as a long-running LVM command elsewhere would.
        let lock = format!("/run/lock/lvm/V_{vg}");
        // -o: the lock belongs to flock itself, so killing flock releases it.
        let mut holder = std::process::Command::new("flock")
            .args(["-o", &lock, "sleep", "120"])
            .spawn()
            .unwrap();
        for _ in 0..100 {
            if sh_status(&format!("flock -n {lock} true")).0 != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let started = Instant::now();
        let err = lvm.lvs(Some(&vg)).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(30));
        match &err {
            Error::Timeout { argv, timeout } => {
                assert_eq!(*timeout, Duration::from_secs(5));
                assert!(argv.to_string().starts_with("lvm lvs"), "{argv}");
            }
            other => panic!("expected Timeout, got {other:?}"),
        }
        wait_gone(pid);
        assert_eq!(lvm.runner().pid().await, None);

        holder.kill().unwrap();
        holder.wait().unwrap();
        assert_eq!(lvm.lvs(Some(&vg)).await.unwrap().len(), 1);
        let new = lvm.runner().pid().await.unwrap();
        assert_ne!(new, pid);
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn a_killed_shell_is_replaced_by_the_next_command() {
        let mut s = Scratch::new(1, 1024);
        let d = s.disks[0].clone();
        let vg = sh_vg_with_pool(&mut s, &d);
        let lvm = shell_lvm();
        assert!(lvm.vg(&vg).await.unwrap().is_some());
        let pid = lvm.runner().pid().await.unwrap();
        sh(&format!("kill -9 {pid}"));
        wait_gone(pid);
        lvm.thin_lv_create(&vg, "pool", "after", 64 * MIB, &[])
            .await
            .unwrap();
        assert!(lvm.lv(&vg, "after").await.unwrap().is_some());
        assert_ne!(lvm.runner().pid().await, Some(pid));
    }

    /// Device commands run as separate processes, and the shell is restarted after a change: a shell keeps
    /// device sizes cached, and the loop device attached here may be one it saw detached (size 0).
    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn devices_attached_after_the_shell_started_are_used_at_their_real_size() {
        let lvm = shell_lvm();
        lvm.vgs().await.unwrap();
        let pid = lvm.runner().pid().await.unwrap();
        let mut s = Scratch::new(1, 1024);
        let d = s.disks[0].clone();
        lvm.pv_create(&d, None).await.unwrap();
        assert_eq!(lvm.runner().pid().await, None, "stopped after pvcreate");
        let vg = s.vg_name();
        lvm.vg_create(&vg, std::slice::from_ref(&d), &[])
            .await
            .unwrap();
        lvm.thin_pool_create(&pool(&vg, 256 * MIB)).await.unwrap();
        let new = lvm
            .runner()
            .pid()
            .await
            .expect("a new shell created the pool");
        assert_ne!(new, pid);
        let pvs = lvm.pvs().await.unwrap();
        let pv = pvs.iter().find(|pv| pv.name == d).expect("new PV listed");
        assert_eq!(pv.vg_name.as_deref(), Some(vg.as_str()));
        assert!(pv.size > 1000 * MIB, "{}", pv.size);
        assert_eq!(
            lvm.runner().pid().await,
            Some(new),
            "pvs reads without a restart"
        );
        assert_eq!(lvm.lvs(Some(&vg)).await.unwrap().len(), 1);
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn a_line_too_long_for_the_shell_runs_as_a_separate_process() {
        let shell = LvmShell::new();
        let mut args = strings(&["vgs", "--reportformat", "json", "-o", "vg_name"]);
        args.extend((0..MAX_WORDS).map(|i| format!("nosuch{i}")));
        let cmd = Command::new("lvm", args);
        let real = RealRunner.run(&cmd).await.unwrap();
        let via = shell.run(&cmd).await.unwrap();
        assert_eq!(via, real);
        assert_eq!(via.code, Some(5));
        assert_eq!(shell.pid().await, None, "the shell was not used");
        // 63 words do go through the shell.
        let cmd = Command::new("lvm", cmd.args[..MAX_WORDS].to_vec());
        let via = shell.run(&cmd).await.unwrap();
        assert!(shell.pid().await.is_some());
        assert_eq!(via.stderr, RealRunner.run(&cmd).await.unwrap().stderr);
    }

    /// Ten thin volumes through separate processes and ten through one shell, each set in its own volume
    /// group with a thin pool: the same volumes come out, and one shell process made all of its ten.
    /// (Speed is measured by `cargo xtask bench`, not here.)
    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn thin_creates_through_one_shell_match_separate_processes() {
        const N: usize = 10;
        let mut s = Scratch::new(2, 2048);
        let (d0, d1) = (s.disks[0].clone(), s.disks[1].clone());
        let vg_process = sh_vg_with_pool(&mut s, &d0);
        let vg_shell = sh_vg_with_pool(&mut s, &d1);

        let process = Lvm::new(RealRunner);
        let shell = shell_lvm();
        assert!(shell.vg(&vg_shell).await.unwrap().is_some());
        let pid = shell.runner().pid().await;
        for i in 0..N {
            let name = format!("t{i}");
            let tags = [format!("n{i}")];
            process
                .thin_lv_create(&vg_process, "pool", &name, GIB, &tags)
                .await
                .unwrap();
            shell
                .thin_lv_create(&vg_shell, "pool", &name, GIB, &tags)
                .await
                .unwrap();
        }
        let summary = |lvs: Vec<lvms_core::model::LogicalVolume>| {
            let mut v: Vec<_> = lvs
                .into_iter()
                .map(|lv| (lv.name, lv.size, lv.segtype, lv.pool_lv, lv.tags))
                .collect();
            v.sort();
            v
        };
        let by_process = summary(process.lvs(Some(&vg_process)).await.unwrap());
        let by_shell = summary(shell.lvs(Some(&vg_shell)).await.unwrap());
        assert_eq!(by_process.len(), N + 1);
        assert_eq!(by_shell, by_process);
        assert_eq!(shell.runner().pid().await, pid, "one shell did all");
    }
}
