//! Parsers for LVM's JSON reports (`--reportformat json --units b --nosuffix`).
//!
//! Layout (lvm2 2.03): `{"report": [{"pv"|"vg"|"lv": [row, ...]}]}`, optionally followed by a `"log"`
//! array when `log/report_command_log=1` (as in `lvm shell`). Every value is a string: sizes are whole
//! bytes (`"1073741824"`), percentages have two decimals (`"12.34"`), an empty string means "no value"
//! (not a thin volume, not active, …), lists such as tags are comma-separated.
//!
//! Quirk: asking `lvs` for a segment field (`segtype`, `stripes`, `stripe_size`) turns the report into a
//! segment report, one row per segment; [`parse_lvs`] keeps one entry per LV (the first segment's values).

use std::collections::HashSet;

use lvms_core::model::{LogicalVolume, PhysicalVolume, VolumeGroup};
use serde::{Deserialize, de::DeserializeOwned};

/// Fields asked of `pvs`.
pub const PV_FIELDS: &str = "pv_name,vg_name,pv_uuid,pv_size,pv_free,pv_attr";
/// Fields asked of `vgs`.
pub const VG_FIELDS: &str = "vg_name,vg_uuid,vg_size,vg_free,vg_extent_size,vg_extent_count,\
                             vg_free_count,pv_count,lv_count,vg_tags,vg_attr,vg_mda_free,vg_mda_size";
/// Fields asked of `lvs`.
pub const LV_FIELDS: &str = "lv_name,vg_name,lv_uuid,lv_size,lv_attr,segtype,pool_lv,origin,\
                             data_percent,metadata_percent,lv_metadata_size,sync_percent,lv_tags,\
                             lv_path,lv_dm_path,stripes,stripe_size";

/// Fields asked of `lvs` for one volume group's LVs and the group itself in one report (see
/// [`parse_group`]): the group's fields, then the LVs' (`vg_name` once).
pub fn group_fields() -> String {
    let lv_fields = LV_FIELDS.split(',').filter(|f| *f != "vg_name");
    VG_FIELDS
        .split(',')
        .chain(lv_fields)
        .collect::<Vec<_>>()
        .join(",")
}

/// An LVM report that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ReportError(pub String);

type Result<T> = std::result::Result<T, ReportError>;

#[derive(Deserialize)]
struct RawPv {
    pv_name: String,
    vg_name: String,
    pv_uuid: String,
    pv_size: String,
    pv_free: String,
    pv_attr: String,
}

#[derive(Deserialize)]
struct RawVg {
    vg_name: String,
    vg_uuid: String,
    vg_size: String,
    vg_free: String,
    vg_extent_size: String,
    vg_extent_count: String,
    vg_free_count: String,
    pv_count: String,
    lv_count: String,
    vg_tags: String,
    vg_attr: String,
    vg_mda_free: String,
    vg_mda_size: String,
}

#[derive(Deserialize)]
struct RawLv {
    lv_name: String,
    vg_name: String,
    lv_uuid: String,
    lv_size: String,
    lv_attr: String,
    segtype: String,
    pool_lv: String,
    origin: String,
    data_percent: String,
    metadata_percent: String,
    lv_metadata_size: String,
    sync_percent: String,
    lv_tags: String,
    lv_path: String,
    lv_dm_path: String,
    stripes: String,
    stripe_size: String,
}

/// The rows of every report section named `key` (`pv`, `vg`, `lv`).
pub(super) fn rows<T: DeserializeOwned>(json: &str, key: &str) -> Result<Vec<T>> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| ReportError(format!("not a JSON report: {e}")))?;
    let sections = value
        .get("report")
        .and_then(|r| r.as_array())
        .ok_or_else(|| ReportError("no \"report\" array in the output".to_owned()))?;
    let mut out = Vec::new();
    for section in sections {
        let Some(list) = section.get(key) else {
            continue;
        };
        let list = list
            .as_array()
            .ok_or_else(|| ReportError(format!("report section {key:?} is not an array")))?;
        for row in list {
            out.push(
                T::deserialize(row).map_err(|e| ReportError(format!("{key} row {row}: {e}")))?,
            );
        }
    }
    Ok(out)
}

fn num(field: &str, value: &str) -> Result<u64> {
    value
        .trim()
        .parse()
        .map_err(|_| ReportError(format!("{field}: {value:?} is not a whole number of bytes")))
}

fn opt_num(field: &str, value: &str) -> Result<Option<u64>> {
    if value.trim().is_empty() {
        Ok(None)
    } else {
        num(field, value).map(Some)
    }
}

fn percent(field: &str, value: &str) -> Result<Option<f64>> {
    let v = value.trim();
    if v.is_empty() {
        return Ok(None);
    }
    v.parse()
        .map(Some)
        .map_err(|_| ReportError(format!("{field}: {value:?} is not a percentage")))
}

fn opt_str(value: String) -> Option<String> {
    if value.is_empty() { None } else { Some(value) }
}

/// Splits LVM's comma-separated tag list (`""` is no tags; tags cannot contain commas).
pub fn split_tags(tags: &str) -> Vec<String> {
    tags.split(',')
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Parses `lvm pvs --reportformat json --units b --nosuffix -o PV_FIELDS`.
pub fn parse_pvs(json: &str) -> Result<Vec<PhysicalVolume>> {
    rows::<RawPv>(json, "pv")?
        .into_iter()
        .map(|r| {
            Ok(PhysicalVolume {
                size: num("pv_size", &r.pv_size)?,
                free: num("pv_free", &r.pv_free)?,
                name: r.pv_name,
                vg_name: opt_str(r.vg_name),
                uuid: r.pv_uuid,
                attr: r.pv_attr,
            })
        })
        .collect()
}

/// Parses `lvm vgs --reportformat json --units b --nosuffix -o VG_FIELDS`.
pub fn parse_vgs(json: &str) -> Result<Vec<VolumeGroup>> {
    vgs_in(json, "vg")
}

/// Parses `lvm lvs [-a] --reportformat json --units b --nosuffix -o <group_fields()> <vg>`: the
/// group (from its first row; `None` when there is no row) and its visible LVs (hidden ones, named
/// in brackets such as a sanlock group's `[lvmlock]`, which `-a` lists, are left out).
pub fn parse_group(json: &str) -> Result<(Option<VolumeGroup>, Vec<LogicalVolume>)> {
    let group = vgs_in(json, "lv")?.into_iter().next();
    let mut lvs = parse_lvs(json)?;
    lvs.retain(|lv| !lv.name.starts_with('['));
    Ok((group, lvs))
}

/// The volume groups of the rows of every section named `key`.
fn vgs_in(json: &str, key: &str) -> Result<Vec<VolumeGroup>> {
    rows::<RawVg>(json, key)?
        .into_iter()
        .map(|r| {
            Ok(VolumeGroup {
                size: num("vg_size", &r.vg_size)?,
                free: num("vg_free", &r.vg_free)?,
                extent_size: num("vg_extent_size", &r.vg_extent_size)?,
                extent_count: num("vg_extent_count", &r.vg_extent_count)?,
                free_count: num("vg_free_count", &r.vg_free_count)?,
                pv_count: num("pv_count", &r.pv_count)?,
                lv_count: num("lv_count", &r.lv_count)?,
                tags: split_tags(&r.vg_tags),
                mda_free: num("vg_mda_free", &r.vg_mda_free)?,
                mda_size: num("vg_mda_size", &r.vg_mda_size)?,
                name: r.vg_name,
                uuid: r.vg_uuid,
                attr: r.vg_attr,
            })
        })
        .collect()
}

/// Parses `lvm lvs --reportformat json --units b --nosuffix -o LV_FIELDS`, one entry per logical volume
/// (segment rows of the same LV after the first are dropped).
pub fn parse_lvs(json: &str) -> Result<Vec<LogicalVolume>> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for r in rows::<RawLv>(json, "lv")? {
        if !seen.insert((r.vg_name.clone(), r.lv_uuid.clone())) {
            continue;
        }
        out.push(LogicalVolume {
            size: num("lv_size", &r.lv_size)?,
            data_percent: percent("data_percent", &r.data_percent)?,
            metadata_percent: percent("metadata_percent", &r.metadata_percent)?,
            metadata_size: opt_num("lv_metadata_size", &r.lv_metadata_size)?,
            sync_percent: percent("sync_percent", &r.sync_percent)?,
            tags: split_tags(&r.lv_tags),
            stripes: opt_num("stripes", &r.stripes)?,
            stripe_size: opt_num("stripe_size", &r.stripe_size)?,
            name: r.lv_name,
            vg_name: r.vg_name,
            uuid: r.lv_uuid,
            attr: r.lv_attr,
            segtype: r.segtype,
            pool_lv: opt_str(r.pool_lv),
            origin: opt_str(r.origin),
            path: opt_str(r.lv_path),
            dm_path: opt_str(r.lv_dm_path),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PVS: &str = include_str!("../../tests/fixtures/lvm/pvs.json");
    const VGS: &str = include_str!("../../tests/fixtures/lvm/vgs.json");
    const LVS: &str = include_str!("../../tests/fixtures/lvm/lvs.json");
    const LVS_EMPTY: &str = include_str!("../../tests/fixtures/lvm/lvs.empty-vg.json");
    /// `lvs -a -o <group_fields()> san` on a shared group (lvm2 2.03.16, Debian 12): a thin pool
    /// with its volume, and a linear volume, beside the hidden LVs; and the group empty.
    const LVS_GROUP: &str = include_str!("../../tests/fixtures/lvm/lvs.group-shared.json");
    const LVS_GROUP_EMPTY: &str =
        include_str!("../../tests/fixtures/lvm/lvs.group-shared.empty.json");
    const LVS_TWO_SEGMENTS: &str =
        include_str!("../../tests/fixtures/lvm/lvs.one-lv-two-segments.json");
    const LVS_COMMAND_LOG: &str =
        include_str!("../../tests/fixtures/lvm/lvs.command-log.not-found.json");
    const LVS_ACTIVE_THIN: &str =
        include_str!("../../tests/fixtures/lvm/lvs.thin-active.handwritten.json");

    #[test]
    fn pvs_report_gives_orphans_without_a_volume_group() {
        let pvs = parse_pvs(PVS).unwrap();
        assert_eq!(pvs.len(), 5);
        assert_eq!(
            pvs[0],
            PhysicalVolume {
                name: "/dev/loop0".into(),
                vg_name: Some("vg1".into()),
                uuid: "68hnXl-KzoN-CJch-DssV-q06O-GG70-wUOtKS".into(),
                size: 1_069_547_520,
                free: pvs[0].free,
                attr: "a--".into(),
            }
        );
        let orphan = &pvs[3];
        assert_eq!(orphan.name, "/dev/loop7");
        assert_eq!(orphan.vg_name, None);
        assert_eq!(orphan.size, 268_435_456);
        assert_eq!(orphan.free, orphan.size);
        assert_eq!(orphan.attr, "---");
    }

    #[test]
    fn vgs_report_gives_sizes_tags_and_metadata_area() {
        let vgs = parse_vgs(VGS).unwrap();
        assert_eq!(vgs.len(), 3);
        let vg1 = &vgs[0];
        assert_eq!(vg1.name, "vg1");
        assert_eq!(vg1.size, 2_139_095_040);
        assert_eq!(vg1.extent_size, 4 * 1024 * 1024);
        assert_eq!(vg1.extent_count, 510);
        assert_eq!(vg1.free, vg1.free_count * vg1.extent_size);
        assert_eq!(vg1.pv_count, 2);
        assert_eq!(vg1.lv_count, 6);
        assert_eq!(vg1.tags, vec!["lvms".to_owned(), "owner=x".to_owned()]);
        assert_eq!(vg1.attr, "wz--n-");
        assert_eq!(vg1.mda_size, 1_044_480);
        assert!(vg1.mda_free > 0 && vg1.mda_free < vg1.mda_size);
        assert!(vgs[1].tags.is_empty());
    }

    #[test]
    fn a_group_report_gives_the_group_once_and_each_visible_lv() {
        let fields = group_fields();
        assert_eq!(fields.matches("vg_name").count(), 1, "{fields}");
        assert!(fields.starts_with(VG_FIELDS), "{fields}");
        let (group, lvs) = parse_group(LVS_GROUP).unwrap();
        let group = group.unwrap();
        assert_eq!(
            (
                group.name.as_str(),
                group.lv_count,
                group.free,
                group.tags.as_slice()
            ),
            ("san", 3, 3_938_451_456, ["lvms".to_owned()].as_slice())
        );
        assert_eq!(
            group,
            parse_vgs(&LVS_GROUP.replace("\"lv\"", "\"vg\"")).unwrap()[0]
        );
        let names: Vec<(&str, &str, &str)> = lvs
            .iter()
            .map(|lv| (lv.name.as_str(), lv.vg_name.as_str(), lv.segtype.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("l1", "san", "linear"),
                ("p1", "san", "thin-pool"),
                ("v1", "san", "thin")
            ]
        );
        assert_eq!(lvs[2].pool_lv.as_deref(), Some("p1"));
        // An empty sanlock group still has its hidden `[lvmlock]` row: the group, no LV.
        let (group, lvs) = parse_group(LVS_GROUP_EMPTY).unwrap();
        let group = group.unwrap();
        assert_eq!(
            (group.name.as_str(), group.lv_count, lvs),
            ("san", 0, Vec::new())
        );
        // No row at all (`lvs` without `-a` on an empty group): no group from this report.
        assert_eq!(parse_group(LVS_EMPTY).unwrap(), (None, Vec::new()));
    }

    #[test]
    fn lvs_report_covers_linear_striped_raid_thin_pool_thin_and_snapshot() {
        let lvs = parse_lvs(LVS).unwrap();
        let names: Vec<_> = lvs.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["lv1", "pool1", "r1", "snap1", "striped1", "thin1"]);
        let by = |n: &str| lvs.iter().find(|l| l.name == n).unwrap();

        let pool = by("pool1");
        assert_eq!(pool.segtype, "thin-pool");
        assert_eq!(pool.size, 200 * 1024 * 1024);
        assert_eq!(pool.metadata_size, Some(4 * 1024 * 1024));
        assert_eq!(
            pool.path, None,
            "LVM gives a thin pool no /dev/<vg>/<lv> path"
        );
        assert_eq!(pool.dm_path.as_deref(), Some("/dev/mapper/vg1-pool1"));
        assert_eq!(pool.data_percent, None, "inactive pools report no usage");

        let thin = by("thin1");
        assert_eq!(thin.segtype, "thin");
        assert_eq!(thin.pool_lv.as_deref(), Some("pool1"));
        assert_eq!(thin.size, 1024 * 1024 * 1024);
        assert_eq!(
            thin.tags,
            vec!["lvms".to_owned(), "pvc=ns/claim".to_owned()]
        );
        assert_eq!(thin.path.as_deref(), Some("/dev/vg1/thin1"));
        assert_eq!(thin.stripes, Some(0));

        let snap = by("snap1");
        assert_eq!(snap.origin.as_deref(), Some("thin1"));
        assert!(
            snap.attr.ends_with('k'),
            "activation skip flag in {}",
            snap.attr
        );
        assert!(
            snap.attr.starts_with("Vr"),
            "read-only thin volume: {}",
            snap.attr
        );

        let striped = by("striped1");
        assert_eq!(striped.segtype, "striped");
        assert_eq!(
            (striped.stripes, striped.stripe_size),
            (Some(2), Some(65536))
        );

        let raid = by("r1");
        assert_eq!(raid.segtype, "raid1");
        assert_eq!(raid.stripes, Some(2));
        assert_eq!(raid.metadata_size, None);
    }

    #[test]
    fn lvs_segment_rows_collapse_into_one_volume() {
        let lvs = parse_lvs(LVS_TWO_SEGMENTS).unwrap();
        assert_eq!(lvs.len(), 1);
        assert_eq!(lvs[0].size, 140 * 1024 * 1024);
        assert_eq!(
            lvs[0].tags,
            vec!["a/b=c:d#e&f!g".to_owned(), "t1".to_owned()]
        );
    }

    #[test]
    fn lvs_of_an_empty_volume_group_is_empty() {
        assert!(parse_lvs(LVS_EMPTY).unwrap().is_empty());
    }

    #[test]
    fn reports_with_a_command_log_section_parse() {
        assert!(parse_lvs(LVS_COMMAND_LOG).unwrap().is_empty());
    }

    #[test]
    fn active_thin_pool_reports_usage_percentages() {
        let lvs = parse_lvs(LVS_ACTIVE_THIN).unwrap();
        let pool = lvs.iter().find(|l| l.segtype == "thin-pool").unwrap();
        assert_eq!(pool.data_percent, Some(12.34));
        assert_eq!(pool.metadata_percent, Some(1.07));
        let thin = lvs.iter().find(|l| l.segtype == "thin").unwrap();
        assert_eq!(thin.data_percent, Some(0.0));
        assert_eq!(thin.metadata_percent, None);
        let raid = lvs.iter().find(|l| l.segtype == "raid1").unwrap();
        assert_eq!(raid.sync_percent, Some(100.0));
    }

    #[test]
    fn malformed_reports_are_errors_naming_the_field() {
        let bad_size = LVS_EMPTY.replace(
            "\"lv\": [",
            r#""lv": [{"lv_name":"a","vg_name":"v","lv_uuid":"u","lv_size":"1.5g","lv_attr":"","segtype":"","pool_lv":"","origin":"","data_percent":"","metadata_percent":"","lv_metadata_size":"","sync_percent":"","lv_tags":"","lv_path":"","lv_dm_path":"","stripes":"","stripe_size":""}"#,
        );
        let err = parse_lvs(&bad_size).unwrap_err();
        assert!(err.0.contains("lv_size"), "{err}");
        assert!(parse_lvs("not json").is_err());
        assert!(parse_lvs("{}").is_err());
        let missing_field = r#"{"report":[{"pv":[{"pv_name":"/dev/x"}]}]}"#;
        assert!(
            parse_pvs(missing_field)
                .unwrap_err()
                .0
                .contains("missing field")
        );
    }

    /// Captured in the test VM with active volumes (`tests/fixtures/real/`, scripts/capture-fixtures.sh).
    #[test]
    fn lvs_from_the_vm_report_pool_and_volume_usage_of_active_thin_volumes() {
        let lvs = parse_lvs(include_str!("../../tests/fixtures/real/lvs-fields.json")).unwrap();
        assert_eq!(lvs.len(), 7);
        let by = |n: &str| lvs.iter().find(|l| l.name == n).unwrap();
        let pool = by("pool1");
        assert_eq!(pool.attr, "twi-aotz--");
        assert_eq!(pool.data_percent, Some(1.56));
        assert_eq!(pool.metadata_percent, Some(10.23));
        assert_eq!(pool.metadata_size, Some(16 * 1024 * 1024));
        assert_eq!(by("thin1").data_percent, Some(3.12));
        assert_eq!(by("thin1").tags, ["lvms-volume"]);
        let snap = by("snap1");
        assert_eq!(snap.attr, "Vwi---tz-k", "inactive, activation skipped");
        assert_eq!(snap.origin.as_deref(), Some("thin1"));
        assert_eq!(snap.data_percent, None);
        assert_eq!(by("raid1").sync_percent, Some(100.0));
        assert_eq!(by("striped1").stripe_size, Some(65536));
        assert_eq!(by("other").vg_name, "foreign");
    }

    #[test]
    fn vgs_with_all_fields_from_the_vm_parse_with_our_field_set() {
        let vgs = parse_vgs(include_str!("../../tests/fixtures/real/vgs-all.json")).unwrap();
        let vg1 = vgs.iter().find(|v| v.name == "vg1").unwrap();
        assert_eq!(vg1.tags, ["lvms"]);
        assert_eq!(vg1.lv_count, 6);
        assert_eq!(vg1.free, 306 * 4 * 1024 * 1024);
        assert_eq!(vg1.mda_size, 5_238_784);
        assert_eq!(vg1.mda_free, 2_613_248);
    }

    #[test]
    fn tags_split_on_commas() {
        assert!(split_tags("").is_empty());
        assert_eq!(split_tags("a,b=c"), vec!["a".to_owned(), "b=c".to_owned()]);
    }
}
