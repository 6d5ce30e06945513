//! StorageClass-style parameters of `CreateVolume` and `GetCapacity`.
//!
//! - [`DEVICE_CLASS`] (`topolvm.io/device-class`): the class; the default class when absent;
//! - [`FSTYPE`] (`csi.storage.k8s.io/fstype`): accepted, checked (ext4 or xfs); the node formats with
//!   the capability's `fs_type`;
//! - thick classes only: [`LV_TYPE`] (`linear`, `striped`, `mirror`, `raid1`, `raid4`, `raid5`,
//!   `raid6`, `raid10`) with [`STRIPES`] (striped: every LVM physical volume of the group when
//!   absent), [`STRIPE_SIZE`] (a quantity such as `64Ki`), [`MIRRORS`], and for mirror and RAID
//!   [`NOSYNC`] and [`INTEGRITY`] (`true`/`false`);
//! - csi-driver-lvm's parameters, unchanged, as the same layouts: [`CSI_DRIVER_LVM_TYPE`] (`linear`;
//!   `striped` over every device; `mirror`, which is raid1 with one extra copy made with `--nosync`
//!   as csi-driver-lvm makes it) and [`CSI_DRIVER_LVM_INTEGRITY`] (with `mirror` only). Unlike
//!   csi-driver-lvm, a layout the group has too few devices for is refused, never made linear.
//!
//! Other keys under `csi.storage.k8s.io/` (the provisioner's extra metadata) and keys of other
//! prefixes are ignored; an unknown key under [`PREFIX`] is an error, so a typo is not silently
//! dropped.

use std::collections::HashMap;

use lvms_core::{
    config::{RaidType, SharedVolumeMode},
    size::ByteSize,
};

use lvms_engine::backend::Layout;

/// The device class parameter.
pub const DEVICE_CLASS: &str = "topolvm.io/device-class";
/// The filesystem parameter.
pub const FSTYPE: &str = "csi.storage.k8s.io/fstype";
/// Prefix of lvms-rs's own parameters.
pub const PREFIX: &str = "lvms.topolvm.io/";
/// The LV type of a thick volume.
pub const LV_TYPE: &str = "lvms.topolvm.io/lv-type";
/// Stripes of a striped or RAID volume.
pub const STRIPES: &str = "lvms.topolvm.io/stripes";
/// Stripe size of a striped or RAID volume.
pub const STRIPE_SIZE: &str = "lvms.topolvm.io/stripe-size";
/// Extra copies of a mirror or raid1/raid10 volume.
pub const MIRRORS: &str = "lvms.topolvm.io/mirrors";
/// Skip the initial synchronisation of a mirror or RAID volume (`--nosync`).
pub const NOSYNC: &str = "lvms.topolvm.io/nosync";
/// dm-integrity under each image of a mirror or RAID volume (`--raidintegrity y`).
pub const INTEGRITY: &str = "lvms.topolvm.io/integrity";
/// csi-driver-lvm's layout parameter: `linear`, `striped` or `mirror`.
pub const CSI_DRIVER_LVM_TYPE: &str = "type";
/// csi-driver-lvm's integrity parameter (a boolean), only with `type: mirror`.
pub const CSI_DRIVER_LVM_INTEGRITY: &str = "integrity";
/// Shared classes: `linear` or `thin` (what the operator renders from `sharedConfig.volumeMode`;
/// KubeSAN's `Linear`/`Thin` spelling is accepted too).
pub const VOLUME_MODE: &str = lvms_api::VOLUME_MODE_PARAMETER;

/// Parameters as understood.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Params {
    /// The class asked for, if any.
    pub class: Option<String>,
    /// The filesystem asked for, if any.
    pub fstype: Option<String>,
    /// The thick layout asked for, if any.
    pub lv_type: Option<Layout>,
    /// Shared classes: the volume mode asked for, if any.
    pub volume_mode: Option<SharedVolumeMode>,
}

fn number(params: &HashMap<String, String>, key: &str) -> Result<Option<u32>, String> {
    params
        .get(key)
        .map(|v| {
            v.parse::<u32>()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| format!("parameter {key}={v:?} must be a whole number from 1 to 64"))
        })
        .transpose()
}

fn stripe_size(params: &HashMap<String, String>) -> Result<Option<u64>, String> {
    params
        .get(STRIPE_SIZE)
        .map(|v| {
            v.parse::<ByteSize>()
                .ok()
                .map(|b| b.0)
                .filter(|b| b.is_power_of_two() && *b >= 4096)
                .ok_or_else(|| {
                    format!(
                        "parameter {STRIPE_SIZE}={v:?} must be a power of two of at least 4Ki, such as 64Ki"
                    )
                })
        })
        .transpose()
}

/// Reads `params`; the error names the parameter and what it may be.
pub fn parse(params: &HashMap<String, String>) -> Result<Params, String> {
    let mut out = Params::default();
    for (k, v) in params {
        if k.len() > 256 || v.len() > 4096 {
            return Err(format!(
                "parameter {:?} is too long (keys up to 256 bytes, values up to 4096)",
                k.chars().take(64).collect::<String>()
            ));
        }
        if k.starts_with(PREFIX)
            && ![
                LV_TYPE,
                STRIPES,
                STRIPE_SIZE,
                MIRRORS,
                NOSYNC,
                INTEGRITY,
                VOLUME_MODE,
            ]
            .contains(&k.as_str())
        {
            return Err(format!(
                "unknown parameter {k}: lvms-rs knows {LV_TYPE}, {STRIPES}, {STRIPE_SIZE}, {MIRRORS}, \
                 {NOSYNC}, {INTEGRITY} and {VOLUME_MODE}"
            ));
        }
    }
    if let Some(class) = params.get(DEVICE_CLASS) {
        if class.is_empty() {
            return Err(format!(
                "parameter {DEVICE_CLASS} is empty: name a device class or leave it out for the default"
            ));
        }
        out.class = Some(class.clone());
    }
    if let Some(fs) = params.get(FSTYPE) {
        if !matches!(fs.as_str(), "ext4" | "xfs") {
            return Err(format!(
                "parameter {FSTYPE}={fs:?} is not supported: use ext4 or xfs"
            ));
        }
        out.fstype = Some(fs.clone());
    }
    out.volume_mode = match params.get(VOLUME_MODE).map(String::as_str) {
        None => None,
        Some("linear" | "Linear") => Some(SharedVolumeMode::Linear),
        Some("thin" | "Thin") => Some(SharedVolumeMode::Thin),
        Some(other) => {
            return Err(format!(
                "parameter {VOLUME_MODE}={other:?} is not a volume mode: use linear or thin"
            ));
        }
    };
    out.lv_type = match (params.get(LV_TYPE), params.get(CSI_DRIVER_LVM_TYPE)) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "parameters {LV_TYPE} and {CSI_DRIVER_LVM_TYPE} both name a layout: keep one \
                 ({CSI_DRIVER_LVM_TYPE} is csi-driver-lvm's linear, striped or mirror)"
            ));
        }
        (None, Some(kind)) => csi_driver_lvm_layout(params, kind)?,
        (lv_type, None) => {
            if params.contains_key(CSI_DRIVER_LVM_INTEGRITY) {
                return Err(format!(
                    "parameter {CSI_DRIVER_LVM_INTEGRITY} is csi-driver-lvm's and needs \
                     {CSI_DRIVER_LVM_TYPE}: mirror; with {LV_TYPE} use {INTEGRITY}"
                ));
            }
            lvms_layout(params, lv_type.map(String::as_str))?
        }
    };
    Ok(out)
}

/// A boolean as Go's `strconv.ParseBool` reads it (what csi-driver-lvm accepts).
fn boolean(params: &HashMap<String, String>, key: &str) -> Result<Option<bool>, String> {
    params
        .get(key)
        .map(|v| match v.as_str() {
            "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
            "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
            other => Err(format!(
                "parameter {key}={other:?} is not a boolean: use \"true\" or \"false\""
            )),
        })
        .transpose()
}

/// csi-driver-lvm's `type` (and `integrity`), as csi-driver-lvm lays the volume out.
fn csi_driver_lvm_layout(
    params: &HashMap<String, String>,
    kind: &str,
) -> Result<Option<Layout>, String> {
    for ours in [STRIPES, STRIPE_SIZE, MIRRORS, NOSYNC, INTEGRITY] {
        if params.contains_key(ours) {
            return Err(format!(
                "parameter {ours} goes with {LV_TYPE}, not with csi-driver-lvm's \
                 {CSI_DRIVER_LVM_TYPE}: use {LV_TYPE} for a layout with settings"
            ));
        }
    }
    let integrity = boolean(params, CSI_DRIVER_LVM_INTEGRITY)?;
    let layout = match kind {
        "linear" => Layout::Linear,
        "striped" => Layout::Striped {
            stripes: None,
            stripe_size: None,
        },
        "mirror" => Layout::Mirror {
            mirrors: 1,
            nosync: true,
            integrity: integrity.unwrap_or(false),
        },
        other => {
            return Err(format!(
                "parameter {CSI_DRIVER_LVM_TYPE}={other:?} is not a csi-driver-lvm volume type: use \
                 linear, striped or mirror (or {LV_TYPE} for the RAID levels)"
            ));
        }
    };
    if integrity.is_some() && !matches!(layout, Layout::Mirror { .. }) {
        return Err(format!(
            "parameter {CSI_DRIVER_LVM_INTEGRITY} applies to {CSI_DRIVER_LVM_TYPE}: mirror only, \
             not {kind}: remove it"
        ));
    }
    Ok(Some(layout))
}

/// lvms-rs's own layout parameters.
fn lvms_layout(
    params: &HashMap<String, String>,
    lv_type: Option<&str>,
) -> Result<Option<Layout>, String> {
    let stripes = number(params, STRIPES)?;
    let mirrors = number(params, MIRRORS)?;
    let size = stripe_size(params)?;
    let nosync = boolean(params, NOSYNC)?;
    let integrity = boolean(params, INTEGRITY)?;
    let Some(lv_type) = lv_type else {
        if stripes.is_some()
            || mirrors.is_some()
            || size.is_some()
            || nosync.is_some()
            || integrity.is_some()
        {
            return Err(format!(
                "{STRIPES}, {STRIPE_SIZE}, {MIRRORS}, {NOSYNC} and {INTEGRITY} need {LV_TYPE} \
                 (striped, mirror or raid*)"
            ));
        }
        return Ok(None);
    };
    let raid_only = |what: &str| {
        format!("{what} applies to mirror and RAID volumes, not {LV_TYPE}={lv_type}: remove it")
    };
    if matches!(lv_type, "linear" | "striped") {
        if nosync.is_some() {
            return Err(raid_only(NOSYNC));
        }
        if integrity.is_some() {
            return Err(raid_only(INTEGRITY));
        }
    }
    let (nosync, integrity) = (nosync.unwrap_or(false), integrity.unwrap_or(false));
    Ok(Some(match lv_type {
        "linear" => Layout::Linear,
        "striped" => Layout::Striped {
            stripes: stripes
                .map(|s| {
                    (s >= 2).then_some(s).ok_or_else(|| {
                        format!(
                            "{LV_TYPE}=striped needs {STRIPES} of at least 2, or none to stripe \
                             over every device"
                        )
                    })
                })
                .transpose()?,
            stripe_size: size,
        },
        "mirror" => Layout::Mirror {
            mirrors: mirrors.unwrap_or(1),
            nosync,
            integrity,
        },
        level => {
            let level = match level {
                "raid1" => RaidType::Raid1,
                "raid4" => RaidType::Raid4,
                "raid5" => RaidType::Raid5,
                "raid6" => RaidType::Raid6,
                "raid10" => RaidType::Raid10,
                other => {
                    return Err(format!(
                        "{LV_TYPE}={other:?} is not supported: use linear, striped, mirror, raid1, \
                         raid4, raid5, raid6 or raid10"
                    ));
                }
            };
            Layout::Raid {
                level,
                mirrors,
                stripes,
                stripe_size: size,
                nosync,
                integrity,
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn empty_parameters_mean_the_default_class() {
        assert_eq!(parse(&p(&[])).unwrap(), Params::default());
    }

    #[test]
    fn class_fstype_and_provisioner_metadata() {
        let got = parse(&p(&[
            (DEVICE_CLASS, "vg1"),
            (FSTYPE, "xfs"),
            ("csi.storage.k8s.io/pvc/name", "data"),
            ("other.example.com/x", "y"),
        ]))
        .unwrap();
        assert_eq!(got.class.as_deref(), Some("vg1"));
        assert_eq!(got.fstype.as_deref(), Some("xfs"));
    }

    #[test]
    fn thick_layouts_parse() {
        assert_eq!(
            parse(&p(&[
                (LV_TYPE, "striped"),
                (STRIPES, "2"),
                (STRIPE_SIZE, "64Ki")
            ]))
            .unwrap()
            .lv_type,
            Some(Layout::Striped {
                stripes: Some(2),
                stripe_size: Some(65536)
            })
        );
        assert_eq!(
            parse(&p(&[(LV_TYPE, "striped")])).unwrap().lv_type,
            Some(Layout::Striped {
                stripes: None,
                stripe_size: None
            }),
            "over every device"
        );
        assert_eq!(
            parse(&p(&[(LV_TYPE, "mirror")])).unwrap().lv_type,
            Some(Layout::Mirror {
                mirrors: 1,
                nosync: false,
                integrity: false
            })
        );
        assert_eq!(
            parse(&p(&[
                (LV_TYPE, "raid5"),
                (NOSYNC, "true"),
                (INTEGRITY, "true")
            ]))
            .unwrap()
            .lv_type,
            Some(Layout::Raid {
                level: RaidType::Raid5,
                mirrors: None,
                stripes: None,
                stripe_size: None,
                nosync: true,
                integrity: true
            })
        );
        assert_eq!(
            parse(&p(&[(LV_TYPE, "raid10"), (MIRRORS, "1"), (STRIPES, "2")]))
                .unwrap()
                .lv_type,
            Some(Layout::Raid {
                level: RaidType::Raid10,
                mirrors: Some(1),
                stripes: Some(2),
                stripe_size: None,
                nosync: false,
                integrity: false
            })
        );
    }

    #[test]
    fn csi_driver_lvm_types_are_its_layouts() {
        let layout = |kv: &[(&str, &str)]| parse(&p(kv)).unwrap().lv_type;
        assert_eq!(layout(&[("type", "linear")]), Some(Layout::Linear));
        assert_eq!(
            layout(&[("type", "striped")]),
            Some(Layout::Striped {
                stripes: None,
                stripe_size: None
            })
        );
        // csi-driver-lvm: --type raid1 --mirrors 1 --nosync [--raidintegrity y].
        for (integrity, want) in [(None, false), (Some("true"), true), (Some("False"), false)] {
            let mut kv = vec![("type", "mirror")];
            kv.extend(integrity.map(|v| ("integrity", v)));
            assert_eq!(
                layout(&kv),
                Some(Layout::Mirror {
                    mirrors: 1,
                    nosync: true,
                    integrity: want
                }),
                "{kv:?}"
            );
        }
    }

    #[test]
    fn the_volume_mode_of_a_shared_class_parses_in_both_spellings() {
        for (v, mode) in [
            ("linear", SharedVolumeMode::Linear),
            ("Linear", SharedVolumeMode::Linear),
            ("thin", SharedVolumeMode::Thin),
            ("Thin", SharedVolumeMode::Thin),
        ] {
            assert_eq!(
                parse(&p(&[(VOLUME_MODE, v)])).unwrap().volume_mode,
                Some(mode)
            );
        }
        assert_eq!(parse(&p(&[])).unwrap().volume_mode, None);
    }

    #[test]
    fn bad_parameters_name_the_key_and_the_fix() {
        for (kv, needle) in [
            (vec![(VOLUME_MODE, "thick")], "use linear or thin"),
            (vec![(FSTYPE, "btrfs")], "use ext4 or xfs"),
            (vec![(LV_TYPE, "raid0")], "is not supported"),
            (vec![(LV_TYPE, "striped"), (STRIPES, "1")], "at least 2"),
            (vec![("type", "raid5")], "not a csi-driver-lvm volume type"),
            (
                vec![("type", "mirror"), ("integrity", "yes")],
                "not a boolean",
            ),
            (
                vec![("type", "linear"), ("integrity", "true")],
                "mirror only",
            ),
            (vec![("integrity", "true")], "needs type: mirror"),
            (
                vec![("type", "mirror"), (LV_TYPE, "mirror")],
                "both name a layout",
            ),
            (
                vec![("type", "striped"), (STRIPES, "2")],
                "goes with lvms.topolvm.io/lv-type",
            ),
            (
                vec![(LV_TYPE, "striped"), (NOSYNC, "true")],
                "mirror and RAID",
            ),
            (
                vec![(LV_TYPE, "linear"), (INTEGRITY, "true")],
                "mirror and RAID",
            ),
            (vec![(NOSYNC, "true")], "need lvms.topolvm.io/lv-type"),
            (vec![(LV_TYPE, "striped"), (STRIPES, "two")], STRIPES),
            (
                vec![(LV_TYPE, "striped"), (STRIPES, "2"), (STRIPE_SIZE, "3000")],
                "power of two",
            ),
            (vec![(STRIPES, "2")], "need lvms.topolvm.io/lv-type"),
            (
                vec![("lvms.topolvm.io/lvtype", "linear")],
                "unknown parameter",
            ),
            (vec![(DEVICE_CLASS, "")], "is empty"),
        ] {
            let err = parse(&p(&kv)).unwrap_err();
            assert!(err.contains(needle), "{kv:?}: {err}");
        }
    }
}
