use super::*;

fn matches(pattern: &str, name: &str) -> bool {
    Pattern::parse(pattern)
        .unwrap_or_else(|e| panic!("{pattern}: {e}"))
        .matches(name)
}

fn error(pattern: &str) -> PatternError {
    Pattern::parse(pattern).expect_err(pattern)
}

#[test]
fn csi_driver_lvm_default_matches_namespaces_of_nvme_disks_only() {
    let p = "/dev/nvme[0-9]n[0-9]";
    assert!(matches(p, "/dev/nvme0n1"));
    assert!(matches(p, "/dev/nvme9n9"));
    assert!(!matches(p, "/dev/nvme0n1p1"), "a partition");
    assert!(!matches(p, "/dev/nvme10n1"), "two digits");
    assert!(!matches(p, "/dev/sda"));
}

#[test]
fn star_matches_any_run_within_one_path_element() {
    assert!(matches("/dev/sd*", "/dev/sd"));
    assert!(matches("/dev/sd*", "/dev/sdb1"));
    assert!(matches(
        "/dev/disk/by-id/*-part2",
        "/dev/disk/by-id/ata-X-part2"
    ));
    assert!(!matches("/dev/*", "/dev/disk/by-id/x"), "* stops at /");
    assert!(matches("/dev/*/*", "/dev/mapper/x"));
    assert!(matches("/dev/*a*b*", "/dev/xaxxbx"));
    assert!(!matches("/dev/*a*b", "/dev/xaxxbx"));
    assert!(matches("*", ""));
}

#[test]
fn question_mark_is_one_character_but_not_a_separator() {
    assert!(matches("/dev/sd?", "/dev/sdb"));
    assert!(!matches("/dev/sd?", "/dev/sd"));
    assert!(!matches("/dev/sd?", "/dev/sdbc"));
    assert!(!matches("/dev?sda", "/dev/sda"));
}

#[test]
fn classes_ranges_negation_and_escapes() {
    assert!(matches("/dev/sd[bc]", "/dev/sdc"));
    assert!(!matches("/dev/sd[bc]", "/dev/sda"));
    assert!(matches("/dev/sd[^a]", "/dev/sdb"));
    assert!(!matches("/dev/sd[^a]", "/dev/sda"));
    assert!(matches("/dev/sd[a-cx-z]", "/dev/sdy"));
    assert!(matches("/dev/x[\\-\\]]", "/dev/x-"));
    assert!(matches("/dev/x[\\-\\]]", "/dev/x]"));
    assert!(matches("/dev/a\\*", "/dev/a*"));
    assert!(!matches("/dev/a\\*", "/dev/ab"));
}

#[test]
fn malformed_patterns_name_the_problem_and_where() {
    let e = error("/dev/sd[b");
    assert_eq!(e.position, 7);
    assert!(e.to_string().contains("not closed"), "{e}");
    assert!(error("/dev/sd[]").to_string().contains("empty"));
    assert!(error("/dev/sd[a-]").to_string().contains("unescaped"));
    assert!(error("/dev/sd\\").to_string().contains("backslash"));
    let e = error("/dev/sd[z-a]");
    assert!(e.to_string().contains("below its start"), "{e}");
}

#[test]
fn split_cuts_at_commas_and_trims_like_csi_driver_lvm() {
    assert_eq!(
        split("/dev/nvme[0-9]n[0-9], /dev/sdb ,"),
        ["/dev/nvme[0-9]n[0-9]", "/dev/sdb", ""]
    );
    assert!(has_meta("/dev/sd?") && !has_meta("/dev/sdb"));
}

#[test]
fn device_pattern_items_split_check_every_pattern_and_name_the_bad_one() {
    let got = parse_device_patterns("/dev/nvme[0-9]n[0-9], /dev/disk/by-id/ata-*").unwrap();
    assert_eq!(
        got.iter().map(Pattern::as_str).collect::<Vec<_>>(),
        ["/dev/nvme[0-9]n[0-9]", "/dev/disk/by-id/ata-*"]
    );
    for (item, fragment) in [
        ("", "empty pattern"),
        ("/dev/sdb,", "empty pattern"),
        ("sdb", "\"sdb\" is not a device pattern"),
        ("/dev/", "\"/dev/\" is not a device pattern"),
        ("/dev/sdb, /dev/sd[", "\"/dev/sd[\" is not a valid pattern"),
    ] {
        let e = parse_device_patterns(item).expect_err(item);
        assert!(e.contains(fragment), "{item:?}: {e}");
    }
}
