//! StorageClass-style parameters of `CreateVolume` and `GetCapacity`.
//!
//! - [`DEVICE_CLASS`] (`topolvm.io/device-class`): the class; the default class when absent;
//! - [`FSTYPE`] (`csi.storage.k8s.io/fstype`): accepted, checked (ext4 or xfs); the node formats with
//!   the capability's `fs_type`;
//! - thick classes only: [`LV_TYPE`] (`linear`, `striped`, `mirror`, `raid1`, `raid4`, `raid5`,
//!   `raid6`, `raid10`) with [`STRIPES`], [`STRIPE_SIZE`] (a quantity such as `64Ki`) and [`MIRRORS`].
//!
//! Other keys under `csi.storage.k8s.io/` (the provisioner's extra metadata) and keys of other
//! prefixes are ignored; an unknown key under [`PREFIX`] is an error, so a typo is not silently
//! dropped.

use std::collections::HashMap;

use lvms_core::{
    config::{RaidType, SharedVolumeMode},
    size::ByteSize,
};

use crate::backend::LvType;

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
    pub lv_type: Option<LvType>,
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
            && ![LV_TYPE, STRIPES, STRIPE_SIZE, MIRRORS, VOLUME_MODE].contains(&k.as_str())
        {
            return Err(format!(
                "unknown parameter {k}: lvms-rs knows {LV_TYPE}, {STRIPES}, {STRIPE_SIZE}, {MIRRORS} \
                 and {VOLUME_MODE}"
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
    let stripes = number(params, STRIPES)?;
    let mirrors = number(params, MIRRORS)?;
    let size = stripe_size(params)?;
    out.lv_type = match params.get(LV_TYPE).map(String::as_str) {
        None => {
            if stripes.is_some() || mirrors.is_some() || size.is_some() {
                return Err(format!(
                    "{STRIPES}, {STRIPE_SIZE} and {MIRRORS} need {LV_TYPE} (striped, mirror or raid*)"
                ));
            }
            None
        }
        Some("linear") => Some(LvType::Linear),
        Some("striped") => Some(LvType::Striped {
            stripes: stripes
                .filter(|s| *s >= 2)
                .ok_or_else(|| format!("{LV_TYPE}=striped needs {STRIPES} of at least 2"))?,
            stripe_size: size,
        }),
        Some("mirror") => Some(LvType::Mirror {
            mirrors: mirrors.unwrap_or(1),
        }),
        Some(level) => {
            let level = match level {
                "raid1" => RaidType::Raid1,
                "raid4" => RaidType::Raid4,
                "raid5" => RaidType::Raid5,
                "raid6" => RaidType::Raid6,
                "raid10" => RaidType::Raid10,
                other => {
                    return Err(format!(
                        "{LV_TYPE}={other:?} is not supported: use linear, striped, mirror, raid1, raid4, raid5, raid6 or raid10"
                    ));
                }
            };
            Some(LvType::Raid {
                level,
                mirrors,
                stripes,
                stripe_size: size,
            })
        }
    };
    Ok(out)
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
            Some(LvType::Striped {
                stripes: 2,
                stripe_size: Some(65536)
            })
        );
        assert_eq!(
            parse(&p(&[(LV_TYPE, "mirror")])).unwrap().lv_type,
            Some(LvType::Mirror { mirrors: 1 })
        );
        assert_eq!(
            parse(&p(&[(LV_TYPE, "raid10"), (MIRRORS, "1"), (STRIPES, "2")]))
                .unwrap()
                .lv_type,
            Some(LvType::Raid {
                level: RaidType::Raid10,
                mirrors: Some(1),
                stripes: Some(2),
                stripe_size: None
            })
        );
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
            (vec![(LV_TYPE, "striped")], "at least 2"),
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
