//! Maps a failed `lvm` command to the error a caller branches on, from LVM's stderr (lvm2 2.03 texts; the
//! fixtures under `tests/fixtures/lvm/stderr/` are captured from real commands).

use crate::{
    error::Error,
    runner::{Command, Output},
};

/// Substrings (lower-cased) that mean "the object is in use".
const IN_USE: &[&str] = &[
    // lvremove / lvchange -an of a mounted or open LV.
    "contains a filesystem in use",
    " in use.",
    "can't remove open logical volume",
    // vgchange -an with open LVs.
    "open logical volume(s)",
    // pvremove of a PV that belongs to a VG; vgreduce of a PV with allocated extents.
    "so please use vgreduce first",
    "still in use",
    // pvcreate on a PV of a VG: "Can't initialize physical volume "/dev/x" of volume group "vg1" without -ff".
    "without -ff",
    // vgremove of a VG that still has LVs, answered "n" because stdin is /dev/null:
    // "Volume group "vg3" not removed".
    "not removed",
    // Shared volume groups: an LV another host has active (exclusively, or shared when asking for
    // exclusive): "LV locked by other host: vg/lv".
    "locked by other host",
    // lvextend of an LV this host holds shared (MULTI_NODE block), which needs it exclusively:
    // "LV is already locked with incompatible mode: vg/lv".
    "locked with incompatible mode",
    // vgremove of a sanlock volume group whose lockspace another host has started: "Lockspace for
    // "vg" not stopped on other hosts".
    "not stopped on other hosts",
];

/// "Volume group "vg1" has insufficient free space (385 extents): 2560 required.",
/// "Insufficient free space: 2535 extents needed, but only 385 available",
/// "Insufficient suitable allocatable extents for logical volume st2: 74 more required",
/// "Insufficient suitable contiguous allocatable extents ...".
const NO_SPACE: &[&str] = &["insufficient free space", "insufficient suitable"];

/// "Logical Volume "lv1" already exists in volume group "vg1"", "A volume group called vg1 already
/// exists.", "Physical volume '/dev/loop1' is already in volume group 'vg1'".
const EXISTS: &[&str] = &["already exists", "is already in volume group"];

/// "Volume group "x" not found", "Failed to find logical volume "vg/lv"", "Failed to find physical
/// volume "/dev/x".", "No PV found on device /dev/x.", "Failed to find device "/dev/x".", "Cannot use
/// /dev/x: device not found", "Pool pool1 not found in Volume group vg1.".
const NOT_FOUND: &[&str] = &["not found", "failed to find", "no pv found on device"];

/// pvcreate / vgcreate refused to wipe a signature: "2 existing signatures left on the device." after
/// "WARNING: xfs signature detected on /dev/loop6 at offset 0. Wipe it? [y/n]: [n]".
const SIGNATURE_LEFT: &str = "existing signature";

/// The typed error for a failed `lvm` command.
pub fn classify(cmd: &Command, out: Output) -> Error {
    let stderr = out.stderr.to_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| stderr.contains(n));
    let message = || {
        let lines: Vec<&str> = out
            .stderr
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        format!(
            "`{}` exited with code {}: {}",
            cmd.argv(),
            out.code
                .map_or_else(|| "none".to_owned(), |c| c.to_string()),
            lines.join("; ")
        )
    };
    if stderr.contains(SIGNATURE_LEFT) {
        let (signature, device) = detected_signature(&out.stderr).unwrap_or_else(|| {
            (
                "unknown".to_owned(),
                cmd.args.last().cloned().unwrap_or_default(),
            )
        });
        return Error::SignatureExists { device, signature };
    }
    if has(IN_USE) {
        return Error::InUse(message());
    }
    if has(NO_SPACE) {
        return Error::InsufficientSpace(message());
    }
    if has(EXISTS) {
        return Error::AlreadyExists(message());
    }
    if has(NOT_FOUND) {
        return Error::NotFound(message());
    }
    out.into_error(cmd)
}

/// Signature type and device of the first "WARNING: <type> signature detected on <dev> at offset ..."
/// line.
fn detected_signature(stderr: &str) -> Option<(String, String)> {
    stderr.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("WARNING: ")?;
        let (sig, rest) = rest.split_once(" signature detected on ")?;
        let (dev, _) = rest.split_once(" at offset ")?;
        Some((sig.to_owned(), dev.to_owned()))
    })
}

/// lvextend's answer when the LV already has the requested size or more: "New size (25 extents) matches
/// existing size (25 extents)." / "New size given (13 extents) not larger than existing size (25
/// extents)".
pub fn is_size_not_larger(stderr: &str) -> bool {
    stderr.contains("matches existing size") || stderr.contains("not larger than existing size")
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! stderr {
        ($name:literal) => {
            include_str!(concat!("../../tests/fixtures/lvm/stderr/", $name, ".txt"))
        };
    }

    fn classify_text(args: &[&str], stderr: &str) -> Error {
        classify(
            &Command::new("lvm", args.iter().copied()),
            Output::failed(5, stderr),
        )
    }

    #[test]
    fn missing_volume_group_logical_volume_and_physical_volume_are_not_found() {
        for text in [
            stderr!("vg-not-found"),
            stderr!("lv-not-found"),
            stderr!("lvcreate-vg-not-found"),
            stderr!("lvremove-not-found"),
            stderr!("vgremove-not-found"),
            stderr!("pvremove-no-pv"),
            stderr!("vgreduce-not-a-pv"),
            stderr!("vgreduce-pv-of-other-vg"),
            stderr!("lvchange-tag-not-found"),
            "  Pool pool1 not found in Volume group vg1.\n",
        ] {
            let err = classify_text(&["lvs"], text);
            assert!(matches!(err, Error::NotFound(_)), "{text:?} -> {err:?}");
        }
    }

    #[test]
    fn existing_names_are_already_exists() {
        for text in [
            stderr!("lvcreate-already-exists"),
            stderr!("vgcreate-already-exists"),
            stderr!("vgextend-already-in-vg"),
        ] {
            let err = classify_text(&["lvcreate"], text);
            assert!(
                matches!(err, Error::AlreadyExists(_)),
                "{text:?} -> {err:?}"
            );
        }
    }

    #[test]
    fn all_insufficient_space_messages_are_insufficient_space() {
        for text in [
            stderr!("lvcreate-insufficient-free-space"),
            stderr!("lvcreate-insufficient-suitable-extents"),
            stderr!("lvextend-insufficient"),
        ] {
            let err = classify_text(&["lvcreate"], text);
            assert!(
                matches!(err, Error::InsufficientSpace(_)),
                "{text:?} -> {err:?}"
            );
        }
    }

    #[test]
    fn open_and_mounted_volumes_are_in_use() {
        for text in [
            stderr!("pvremove-in-use"),
            stderr!("lvremove-in-use.handwritten"),
            stderr!("vgchange-open-lvs.handwritten"),
            stderr!("pvcreate-in-vg"),
            stderr!("vgremove-has-lvs"),
            "  Logical volume vg1/lv1 in use.\n",
            "  Can't remove open logical volume \"lv1\"\n",
            "  Physical volume \"/dev/vdb\" still in use\n",
            // Shared volume groups, as lvm2 2.03.16 with lvmlockd says them (seen in the two-VM tests).
            "  LV locked by other host: san/v1\n  Failed to lock logical volume san/v1.\n",
            "  LV is already locked with incompatible mode: san/csi-pcjvi2v6ajos4nulx7fn5gbdfc\n",
        ] {
            let err = classify_text(&["lvremove"], text);
            assert!(matches!(err, Error::InUse(_)), "{text:?} -> {err:?}");
        }
    }

    #[test]
    fn refused_signature_wipe_names_the_signature_and_device() {
        let err = classify_text(
            &["pvcreate", "/dev/loop6"],
            stderr!("pvcreate-signature-refused"),
        );
        match err {
            Error::SignatureExists { device, signature } => {
                assert_eq!(device, "/dev/loop6");
                assert_eq!(signature, "xfs");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refused_signature_names_the_device_lvm_refused_not_the_last_argument() {
        let err = classify_text(
            &["vgcreate", "vg1", "/dev/loop6", "/dev/loop7"],
            stderr!("pvcreate-signature-refused"),
        );
        assert!(
            matches!(&err, Error::SignatureExists { device, .. } if device == "/dev/loop6"),
            "{err:?}"
        );
    }

    #[test]
    fn other_failures_keep_argv_code_and_whole_stderr() {
        let err = classify_text(&["lvcreate", "-i", "3"], stderr!("too-many-stripes"));
        match &err {
            Error::CommandFailed { argv, code, stderr } => {
                assert_eq!(argv.to_string(), "lvm lvcreate -i 3");
                assert_eq!(*code, Some(5));
                assert_eq!(
                    stderr,
                    "  Number of stripes (3) must not exceed number of physical volumes (2)"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn typed_errors_carry_argv_and_every_stderr_line() {
        let err = classify_text(&["vgs", "nosuch"], stderr!("vg-not-found"));
        assert_eq!(
            err.to_string(),
            "not found: `lvm vgs nosuch` exited with code 5: Volume group \"nosuch\" not found; \
             Cannot process volume group nosuch"
        );
    }

    /// `tests/fixtures/real/errors.txt`: stderr of failing commands in the test VM (active VG, udev).
    #[test]
    fn error_texts_from_the_vm_map_to_their_variants() {
        let real = include_str!("../../tests/fixtures/real/errors.txt");
        let lines: Vec<&str> = real.lines().collect();
        let case = |text: &str| classify_text(&["x"], text);
        assert!(
            matches!(case(lines[0]), Error::InsufficientSpace(_)),
            "{}",
            lines[0]
        );
        assert!(matches!(case(lines[1]), Error::NotFound(_)), "{}", lines[1]);
        assert!(matches!(case(&lines[2..4].join("\n")), Error::NotFound(_)));
        assert!(
            matches!(case(lines[4]), Error::AlreadyExists(_)),
            "{}",
            lines[4]
        );
        // vgcreate of an existing, active VG: LVM trips over /dev/<vg> before its own name check.
        assert!(
            matches!(case(&lines[5..7].join("\n")), Error::AlreadyExists(_)),
            "{}",
            lines[5]
        );
        assert!(matches!(case(lines[7]), Error::NotFound(_)), "{}", lines[7]);
    }

    #[test]
    fn lvextend_to_the_same_or_a_smaller_size_is_recognised() {
        assert!(is_size_not_larger(stderr!("lvextend-same-size")));
        assert!(is_size_not_larger(stderr!("lvextend-smaller")));
        assert!(!is_size_not_larger(stderr!("lvextend-insufficient")));
    }
}
