//! Installing the fence hook on a host (ADR 0028): the node agent copies its own binary to a host
//! directory and, when the host's LVM configuration names no kill command, points
//! `lvmlockctl_kill_command` at it in `lvmlocal.conf`, inside a marked block that only lvms-rs
//! writes. A kill command the host already has is never replaced: our hook (by hand, at any path)
//! is kept, any other one is reported and the class is not served under `watchdog: Required`.
//!
//! `lvmlocal.conf` is read after `lvm.conf` and its settings win; lvmlockctl reads the value with
//! `lvm config --typeconfig full global/lvmlockctl_kill_command`, which merges both.

use super::fencing::is_fence_hook;

/// The lines that open and close the block lvms-rs writes in `lvmlocal.conf`.
pub const BEGIN: &str = "# BEGIN lvms-rs fence hook";
pub const END: &str = "# END lvms-rs fence hook";

/// Where the node agent installs the hook by default (`LVMS_FENCE_HOOK_DIR`): a host directory the
/// node pod mounts at the same path.
pub const DEFAULT_DIR: &str = "/var/lib/lvms/bin";

/// Whether `dir` can hold the hook: the command `<dir>/lvms fence` is one lvms fence hook (an
/// absolute path without blanks).
pub fn is_valid_dir(dir: &str) -> bool {
    dir.starts_with('/') && is_fence_hook(&command(&format!("{}/lvms", dir.trim_end_matches('/'))))
}

/// The file the block goes to, in the LVM system directory.
pub const LOCAL_CONF: &str = "lvmlocal.conf";

/// The kill command that runs the hook binary at `binary` (`<dir>/lvms`).
pub fn command(binary: &str) -> String {
    format!("{binary} fence")
}

/// What to do with the host's `lvmlocal.conf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookPlan {
    /// `lvmlockctl_kill_command` already runs an lvms fence hook: nothing to write.
    InPlace,
    /// Write this text as `lvmlocal.conf` (the file as it was, with our block added or replaced).
    Write(String),
    /// The host's configuration is not ours to change: why, and what the admin can do.
    Refused(String),
}

/// Decides what to write so that lvmlockctl runs `<binary> fence`: `kill_command` is the value the
/// host's LVM configuration gives now (empty when unset), `local_conf` the text of
/// `lvmlocal.conf` (`None` when there is none).
pub fn plan(kill_command: &str, local_conf: Option<&str>, binary: &str) -> HookPlan {
    let wanted = command(binary);
    let kill_command = kill_command.trim();
    let text = local_conf.unwrap_or_default();
    let ours = block_span(text);
    if kill_command == wanted && ours.is_some() {
        return HookPlan::InPlace;
    }
    if let Some((start, end)) = ours {
        // Our block, naming another binary (the hook directory changed): replace it. The block
        // sets the value that counts (lvmlocal.conf wins), so nothing else names a command.
        return HookPlan::Write(format!(
            "{}{}{}",
            &text[..start],
            block(binary),
            &text[end..]
        ));
    }
    if is_fence_hook(kill_command) {
        // An lvms fence hook the admin installed: theirs to keep current.
        return HookPlan::InPlace;
    }
    if !kill_command.is_empty() {
        return HookPlan::Refused(format!(
            "lvmlockctl_kill_command is already \"{kill_command}\" on this host, which lvms-rs \
             does not replace: make that command run `{wanted} <vg>` (or remove it, and the node \
             agent installs the hook), or set sharedConfig.watchdog: Disabled"
        ));
    }
    if has_global_section(text) {
        return HookPlan::Refused(format!(
            "{LOCAL_CONF} has a global section of its own, which lvms-rs does not edit: add \
             `lvmlockctl_kill_command = \"{wanted}\"` to it"
        ));
    }
    let mut out = text.to_owned();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(&block(binary));
    HookPlan::Write(out)
}

/// The block lvms-rs writes, ending in a newline.
pub fn block(binary: &str) -> String {
    format!(
        "{BEGIN}\n\
         # Written by the lvms-rs node agent (ADR 0028): sanlock runs `lvmlockctl --kill <vg>` when\n\
         # this host loses a shared volume group's leases, and lvmlockctl runs this command. To\n\
         # install the hook by hand instead, start the node agent with LVMS_FENCE_HOOK_DIR=\"\".\n\
         global {{\n\
         \tlvmlockctl_kill_command = \"{}\"\n\
         }}\n\
         {END}\n",
        command(binary)
    )
}

/// Where our block is in `text` (from its first byte to the byte after its last line).
fn block_span(text: &str) -> Option<(usize, usize)> {
    let start = line_start(text, BEGIN)?;
    let end_line = start + line_start(&text[start..], END)?;
    let end = text[end_line..]
        .find('\n')
        .map_or(text.len(), |i| end_line + i + 1);
    Some((start, end))
}

/// The offset of the first line of `text` that is `line` (surrounding blanks ignored).
fn line_start(text: &str, line: &str) -> Option<usize> {
    let mut offset = 0;
    for l in text.split_inclusive('\n') {
        if l.trim() == line {
            return Some(offset);
        }
        offset += l.len();
    }
    None
}

/// Whether `text` (LVM's configuration syntax) opens a `global` section outside comments.
fn has_global_section(text: &str) -> bool {
    text.lines().any(|l| {
        let code = l.split('#').next().unwrap_or_default().trim();
        code.strip_prefix("global")
            .is_some_and(|rest| rest.trim_start().starts_with('{'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIN: &str = "/var/lib/lvms/bin/lvms";

    /// Debian's lvmlocal.conf, shortened: comments and an empty local section.
    const DEBIAN: &str = "# This is a local configuration file template for the LVM2 system\n\
                          # global {\n#\tfoo = 1\n# }\nlocal {\n\t# system_id = \"\"\n}\n";

    #[test]
    fn an_unset_kill_command_gets_our_block_after_the_admins_text() {
        let HookPlan::Write(text) = plan("", Some(DEBIAN), BIN) else {
            panic!("expected a write");
        };
        assert!(text.starts_with(DEBIAN), "{text}");
        assert!(
            text.contains("\tlvmlockctl_kill_command = \"/var/lib/lvms/bin/lvms fence\"\n"),
            "{text}"
        );
        assert!(text.trim_end().ends_with(END), "{text}");
        // Written again with the value in place: nothing to do.
        assert_eq!(plan(&command(BIN), Some(&text), BIN), HookPlan::InPlace);
    }

    #[test]
    fn no_lvmlocal_conf_is_written_with_the_block_alone() {
        assert_eq!(plan("", None, BIN), HookPlan::Write(block(BIN)));
    }

    #[test]
    fn our_block_naming_another_directory_is_replaced_in_place() {
        let old = format!("{DEBIAN}\n{}local2 {{\n}}\n", block("/opt/lvms/lvms"));
        let HookPlan::Write(text) = plan("/opt/lvms/lvms fence", Some(&old), BIN) else {
            panic!("expected a write");
        };
        assert_eq!(
            text,
            format!("{DEBIAN}\n{}local2 {{\n}}\n", block(BIN)),
            "only the block changes"
        );
    }

    #[test]
    fn another_kill_command_is_refused_and_named() {
        let HookPlan::Refused(why) = plan("/usr/sbin/my-fence --all", Some(DEBIAN), BIN) else {
            panic!("expected a refusal");
        };
        assert!(why.contains("\"/usr/sbin/my-fence --all\""), "{why}");
        assert!(why.contains("sharedConfig.watchdog: Disabled"), "{why}");
    }

    #[test]
    fn an_lvms_hook_set_by_hand_is_kept() {
        assert_eq!(
            plan("/usr/local/bin/lvms fence", Some(DEBIAN), BIN),
            HookPlan::InPlace
        );
    }

    #[test]
    fn a_global_section_of_the_admins_is_not_edited() {
        let conf = "global {\n\tuse_lvmlockd = 1\n}\n";
        let HookPlan::Refused(why) = plan("", Some(conf), BIN) else {
            panic!("expected a refusal");
        };
        assert!(why.contains("global section"), "{why}");
        assert!(why.contains("/var/lib/lvms/bin/lvms fence"), "{why}");
        // A commented-out one is not a section.
        assert!(!has_global_section("# global {\n"));
        assert!(has_global_section("  global{ \n"));
    }

    #[test]
    fn a_hook_directory_is_absolute_and_without_blanks() {
        assert!(is_valid_dir(DEFAULT_DIR));
        assert!(is_valid_dir("/opt/lvms/"));
        assert!(!is_valid_dir("var/lib/lvms"));
        assert!(!is_valid_dir("/var/lib/my lvms"));
        assert!(!is_valid_dir(""));
    }

    #[test]
    fn a_file_without_a_final_newline_keeps_its_last_line() {
        let HookPlan::Write(text) = plan("", Some("local {\n}"), BIN) else {
            panic!("expected a write");
        };
        assert!(text.starts_with("local {\n}\n\n# BEGIN"), "{text}");
    }
}
