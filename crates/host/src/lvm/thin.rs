//! What a thin pool's metadata says about its thin volumes: the chunks a thin volume maps
//! (`thin_dump`) and the chunks where two thin volumes of one pool differ (`thin_delta`), for
//! changed-block tracking (CSI `SnapshotMetadata`, ADR 0039).
//!
//! The pool is in use while it is read, so the tools read a *metadata snapshot*: the kernel is asked
//! to keep a frozen copy of the metadata root (`dmsetup message <vg>-<pool>-tpool 0
//! reserve_metadata_snap`), the tool reads that copy (`-m`) from the pool's metadata device, and the
//! copy is released after (`release_metadata_snap`), also when the tool failed. A pool holds one
//! such copy at a time; callers serialise reads of one pool. A copy found held when a read starts is
//! one a crashed read left behind (LVM takes none): it is released and taken again.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Lvm, lv_path, report::rows, report_args};
use crate::{
    error::{Error, Result},
    runner::{Command, Output, Runner},
    validate,
};

/// `dmsetup`.
const DMSETUP: &str = "dmsetup";
/// thin-provisioning-tools.
const THIN_DELTA: &str = "thin_delta";
const THIN_DUMP: &str = "thin_dump";
/// Reading a large pool's metadata can take a while; nothing else waits on it but the reader.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Runs of chunks of one thin pool, in chunk units: sorted, merged, non-overlapping
/// `(first chunk, number of chunks)`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChunkRuns {
    /// The pool's chunk size in bytes (its `data_block_size`).
    pub chunk_bytes: u64,
    pub runs: Vec<(u64, u64)>,
}

impl ChunkRuns {
    /// The runs as byte ranges `(offset, length)`, cut at `size` bytes (a volume never maps past
    /// its end, but a shrunk one could have).
    pub fn byte_ranges(&self, size: u64) -> Vec<(u64, u64)> {
        self.runs
            .iter()
            .filter_map(|&(first, count)| {
                let start = first.checked_mul(self.chunk_bytes)?;
                let end = first
                    .checked_add(count)?
                    .checked_mul(self.chunk_bytes)?
                    .min(size);
                (start < end).then_some((start, end - start))
            })
            .collect()
    }

    fn merged(chunk_bytes: u64, mut runs: Vec<(u64, u64)>) -> Self {
        runs.retain(|&(_, n)| n > 0);
        runs.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
        for (first, count) in runs {
            match out.last_mut() {
                Some((f, n)) if *f + *n >= first => *n = (*n).max(first + count - *f),
                _ => out.push((first, count)),
            }
        }
        Self {
            chunk_bytes,
            runs: out,
        }
    }
}

/// The value of attribute `name` in one XML element line (`name="value"`).
fn attr<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let mut rest = line;
    loop {
        let at = rest.find(name)?;
        let before = rest[..at].chars().last();
        let after = &rest[at + name.len()..];
        rest = after;
        if before.is_some_and(char::is_whitespace)
            && let Some(value) = after.strip_prefix("=\"")
        {
            return value.split('"').next();
        }
    }
}

fn number(line: &str, name: &str) -> std::result::Result<u64, String> {
    attr(line, name)
        .ok_or_else(|| format!("{name} missing in {line:?}"))?
        .parse()
        .map_err(|e| format!("{name} in {line:?}: {e}"))
}

/// The element name of one line (`<range_mapping ...` → `range_mapping`).
fn element(line: &str) -> Option<&str> {
    let tag = line.trim_start().strip_prefix('<')?;
    tag.split(|c: char| c.is_whitespace() || c == '>' || c == '/')
        .next()
}

/// The chunk size in bytes from the `<superblock ... data_block_size="<sectors>">` line.
fn chunk_bytes(xml: &str) -> std::result::Result<u64, String> {
    let line = xml
        .lines()
        .find(|l| element(l) == Some("superblock"))
        .ok_or("no <superblock> element")?;
    let sectors = number(line, "data_block_size")?;
    if sectors == 0 {
        return Err("data_block_size is 0".to_owned());
    }
    Ok(sectors * 512)
}

/// `thin_delta --snap1 A --snap2 B` (its short form): the chunks where the two devices differ, whether
/// mapped by both to different data (`different`), by the first only (`left_only`: the second reads
/// zeroes there) or by the second only (`right_only`). `same` runs are left out.
pub fn parse_delta(xml: &str) -> std::result::Result<ChunkRuns, String> {
    let chunk = chunk_bytes(xml)?;
    if xml.contains("<range ") {
        return Err("thin_delta's verbose form is not read: run it without --verbose".into());
    }
    let mut diff = false;
    let mut runs = Vec::new();
    for line in xml.lines() {
        match element(line) {
            Some("diff") => diff = true,
            Some("different" | "left_only" | "right_only") if diff => {
                runs.push((number(line, "begin")?, number(line, "length")?));
            }
            _ => {}
        }
    }
    if !diff {
        return Err("no <diff> element".to_owned());
    }
    Ok(ChunkRuns::merged(chunk, runs))
}

/// `thin_dump --dev-id N`: the chunks device `dev_id` maps.
pub fn parse_dump(xml: &str, dev_id: u64) -> std::result::Result<ChunkRuns, String> {
    let chunk = chunk_bytes(xml)?;
    let mut inside = false;
    let mut found = false;
    let mut runs = Vec::new();
    for line in xml.lines() {
        match element(line) {
            Some("device") => {
                inside = number(line, "dev_id")? == dev_id;
                found |= inside;
            }
            Some("single_mapping") if inside => runs.push((number(line, "origin_block")?, 1)),
            Some("range_mapping") if inside => {
                runs.push((number(line, "origin_begin")?, number(line, "length")?));
            }
            _ => {}
        }
    }
    if !found {
        return Err(format!("no <device dev_id=\"{dev_id}\"> element"));
    }
    Ok(ChunkRuns::merged(chunk, runs))
}

/// The device-mapper name of `vg/lv` and a layer suffix (`-tpool`, or `""`): each dash of the two
/// names doubled, then the names joined by one dash and the suffix added as it is.
fn dm_name(vg: &str, lv: &str, layer: &str) -> String {
    format!("{}-{}{layer}", vg.replace('-', "--"), lv.replace('-', "--"))
}

#[derive(Deserialize)]
struct ThinIdRow {
    lv_name: String,
    thin_id: String,
}

/// `held metadata root` of a thin-pool status line: `-` when none is held.
fn holds_metadata_snapshot(status: &str) -> bool {
    // <start> <len> thin-pool <transaction> <meta used/total> <data used/total> <held root> ...
    status
        .split_whitespace()
        .nth(6)
        .is_some_and(|held| held != "-")
}

impl<R: Runner> Lvm<R> {
    /// The thin device id of each thin volume of `vg` named in `names` (one `lvs` of those LVs
    /// only, not of the whole group).
    async fn thin_ids(&self, vg: &str, names: &[&str]) -> Result<Vec<u64>> {
        let mut args = report_args("lvs", "lv_name,thin_id", None);
        args.extend(names.iter().map(|name| lv_path(vg, name)));
        let found: BTreeMap<String, String> = self
            .report(args, |json| rows::<ThinIdRow>(json, "lv"))
            .await?
            .into_iter()
            .map(|r| (r.lv_name, r.thin_id))
            .collect();
        names
            .iter()
            .map(|name| {
                found
                    .get(*name)
                    .and_then(|id| id.trim().parse().ok())
                    .ok_or_else(|| Error::NotFound(format!("thin volume {}", lv_path(vg, name))))
            })
            .collect()
    }

    async fn dmsetup(&self, args: &[&str]) -> Result<Output> {
        let cmd = Command::new(DMSETUP, args.iter().copied()).timeout(self.timeout);
        let out = self.runner.run(&cmd).await?;
        if out.success() {
            Ok(out)
        } else {
            Err(Error::CommandFailed {
                argv: cmd.argv(),
                code: out.code,
                stderr: out.stderr,
            })
        }
    }

    /// Runs `tool args... -m <metadata device>` on a metadata snapshot of `vg/pool` and returns its
    /// standard output; the snapshot is released whatever happened.
    async fn on_metadata_snapshot(
        &self,
        vg: &str,
        pool: &str,
        tool: &str,
        args: Vec<String>,
    ) -> Result<String> {
        let tpool = dm_name(vg, pool, "-tpool");
        let status = self
            .dmsetup(&["status", &tpool])
            .await
            .map_err(|e| match e {
                Error::CommandFailed { stderr, .. } => Error::NotFound(format!(
                    "thin pool {} is not active on this node ({})",
                    lv_path(vg, pool),
                    stderr.trim()
                )),
                e => e,
            })?;
        if holds_metadata_snapshot(&status.stdout) {
            tracing::warn!(vg, pool, "a metadata snapshot was left held: releasing it");
            self.dmsetup(&["message", &tpool, "0", "release_metadata_snap"])
                .await?;
        }
        self.dmsetup(&["message", &tpool, "0", "reserve_metadata_snap"])
            .await?;
        let meta = format!("/dev/mapper/{}", dm_name(vg, &format!("{pool}_tmeta"), ""));
        let mut argv = args;
        argv.extend(["-m".to_owned(), meta]);
        let cmd = Command::new(tool, argv).timeout(READ_TIMEOUT);
        let read = self.runner.run(&cmd).await;
        let released = self
            .dmsetup(&["message", &tpool, "0", "release_metadata_snap"])
            .await;
        let out = read?;
        released?;
        if !out.success() {
            return Err(Error::CommandFailed {
                argv: cmd.argv(),
                code: out.code,
                stderr: out.stderr,
            });
        }
        Ok(out.stdout)
    }

    /// The chunks thin volume `vg/lv` of pool `vg/pool` maps (has data for), read from a metadata
    /// snapshot of the pool, which must be active here.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn thin_mapped(&self, vg: &str, pool: &str, lv: &str) -> Result<ChunkRuns> {
        validate::lvm_name(vg)?;
        validate::lvm_name(pool)?;
        validate::lvm_name(lv)?;
        let [id] = self.thin_ids(vg, &[lv]).await?[..] else {
            unreachable!("one id per name")
        };
        let args = vec!["--dev-id".to_owned(), id.to_string()];
        let xml = self.on_metadata_snapshot(vg, pool, THIN_DUMP, args).await?;
        parse_dump(&xml, id).map_err(|detail| Error::Parse {
            argv: crate::error::Argv(vec![THIN_DUMP.to_owned()]),
            detail,
        })
    }

    /// The chunks where thin volumes `vg/a` and `vg/b` of pool `vg/pool` differ: mapped to
    /// different data, or mapped by one only. Read from a metadata snapshot of the pool, which must
    /// be active here.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn thin_changed(&self, vg: &str, pool: &str, a: &str, b: &str) -> Result<ChunkRuns> {
        validate::lvm_name(vg)?;
        validate::lvm_name(pool)?;
        validate::lvm_name(a)?;
        validate::lvm_name(b)?;
        let [left, right] = self.thin_ids(vg, &[a, b]).await?[..] else {
            unreachable!("one id per name")
        };
        let args = vec![
            "--snap1".to_owned(),
            left.to_string(),
            "--snap2".to_owned(),
            right.to_string(),
        ];
        let xml = self
            .on_metadata_snapshot(vg, pool, THIN_DELTA, args)
            .await?;
        parse_delta(&xml).map_err(|detail| Error::Parse {
            argv: crate::error::Argv(vec![THIN_DELTA.to_owned()]),
            detail,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// thin_delta 0.9.0 in the test VM: chunks 2–4 written, snapshot 2; chunk 3 and 10–11 written,
    /// chunk 2 discarded, snapshot 3.
    const DELTA: &str = r#"<superblock uuid="" time="2" transaction="3" data_block_size="128" nr_data_blocks="0">
  <diff left="2" right="3">
    <left_only begin="2" length="1"/>
    <different begin="3" length="1"/>
    <same begin="4" length="1"/>
    <right_only begin="10" length="2"/>
  </diff>
</superblock>
"#;

    const DUMP: &str = r#"<superblock uuid="" time="2" transaction="3" flags="0" version="2" data_block_size="128" nr_data_blocks="0">
  <device dev_id="3" mapped_blocks="4" transaction="2" creation_time="2" snap_time="2">
    <single_mapping origin_block="3" data_block="3" time="1"/>
    <single_mapping origin_block="4" data_block="2" time="0"/>
    <range_mapping origin_begin="10" data_begin="4" length="2" time="1"/>
  </device>
</superblock>
"#;

    #[test]
    fn a_delta_is_every_chunk_that_differs_and_none_that_is_the_same() {
        let runs = parse_delta(DELTA).unwrap();
        assert_eq!(runs.chunk_bytes, 65536);
        // 2 (discarded), 3 (rewritten) merge; 4 is the same; 10–11 are new.
        assert_eq!(runs.runs, vec![(2, 2), (10, 2)]);
        assert_eq!(
            runs.byte_ranges(64 << 20),
            vec![(2 * 65536, 2 * 65536), (10 * 65536, 2 * 65536)]
        );
    }

    #[test]
    fn a_dump_is_every_chunk_the_device_maps() {
        let runs = parse_dump(DUMP, 3).unwrap();
        assert_eq!(runs.runs, vec![(3, 2), (10, 2)]);
        assert!(parse_dump(DUMP, 7).unwrap_err().contains("dev_id=\"7\""));
    }

    #[test]
    fn ranges_stop_at_the_volume_end() {
        let runs = ChunkRuns {
            chunk_bytes: 65536,
            runs: vec![(0, 1), (15, 4)],
        };
        assert_eq!(
            runs.byte_ranges(16 * 65536),
            vec![(0, 65536), (15 * 65536, 65536)]
        );
        assert_eq!(runs.byte_ranges(15 * 65536), vec![(0, 65536)]);
    }

    #[test]
    fn overlapping_and_touching_runs_merge() {
        let runs = ChunkRuns::merged(512, vec![(5, 2), (0, 1), (1, 1), (6, 4), (20, 0)]);
        assert_eq!(runs.runs, vec![(0, 2), (5, 5)]);
    }

    #[test]
    fn output_that_is_not_the_short_form_is_refused() {
        let verbose = DELTA.replace(
            r#"<different begin="3" length="1"/>"#,
            "<different>\n      <range begin=\"3\" left_data_begin=\"1\" right_data_begin=\"3\" length=\"1\"/>\n    </different>",
        );
        assert!(parse_delta(&verbose).unwrap_err().contains("verbose"));
        assert!(parse_delta("").unwrap_err().contains("superblock"));
    }

    #[test]
    fn device_mapper_names_double_each_dash() {
        assert_eq!(
            dm_name("my-vg", "my-pool", "-tpool"),
            "my--vg-my--pool-tpool"
        );
        assert_eq!(dm_name("vg", "pool_tmeta", ""), "vg-pool_tmeta");
    }

    #[test]
    fn a_held_metadata_root_is_seen_in_the_pool_status() {
        let free =
            "0 524288 thin-pool 3 113/1024 6/4096 - rw no_discard_passdown queue_if_no_space - 256";
        let held = "0 524288 thin-pool 3 113/1024 6/4096 37 rw no_discard_passdown queue_if_no_space - 256";
        assert!(!holds_metadata_snapshot(free));
        assert!(holds_metadata_snapshot(held));
    }
}
