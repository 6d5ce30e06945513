//! LVM object names. Every name that reaches an `lvm` command line passes [`validate_lvm_name`] first, so no
//! user string is ever read by LVM as an option or a path.

/// LVM's limit for a volume group or logical volume name (NAME_LEN - 1).
pub const MAX_LVM_NAME_LEN: usize = 127;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("LVM name is empty: give a name of letters, digits and + _ . -")]
    Empty,
    #[error("LVM name {name:?} is {len} characters long: LVM allows at most {MAX_LVM_NAME_LEN}")]
    TooLong { name: String, len: usize },
    #[error(
        "LVM name {name:?} starts with '-': LVM would read it as an option; start with a letter or digit"
    )]
    LeadingDash { name: String },
    #[error(
        "LVM name {name:?} is reserved: '.' and '..' cannot name a volume group or logical volume"
    )]
    Dots { name: String },
    #[error(
        "LVM name {name:?} contains {ch:?}: only letters, digits and + _ . - are allowed in LVM names"
    )]
    BadChar { name: String, ch: char },
    #[error("LVM name {name:?} uses LVM's reserved {reserved:?}: choose a name without it")]
    Reserved {
        name: String,
        reserved: &'static str,
    },
}

/// Checks a volume group or logical volume name against LVM's rules (lvm2 `validate_name` and the reserved
/// prefixes and substrings of `apply_lvname_restrictions`).
pub fn validate_lvm_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_LVM_NAME_LEN {
        return Err(NameError::TooLong {
            name: name.to_owned(),
            len: name.len(),
        });
    }
    if name.starts_with('-') {
        return Err(NameError::LeadingDash {
            name: name.to_owned(),
        });
    }
    if name == "." || name == ".." {
        return Err(NameError::Dots {
            name: name.to_owned(),
        });
    }
    if let Some(ch) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '_' | '.' | '-')))
    {
        return Err(NameError::BadChar {
            name: name.to_owned(),
            ch,
        });
    }
    for reserved in ["snapshot", "pvmove"] {
        if name.starts_with(reserved) {
            return Err(NameError::Reserved {
                name: name.to_owned(),
                reserved,
            });
        }
    }
    for reserved in [
        "_cdata", "_cmeta", "_corig", "_cpool", "_cvol", "_mimage", "_mlog", "_pmspare", "_rimage",
        "_rmeta", "_tdata", "_tmeta", "_vdata", "_vorigin", "_wcorig",
    ] {
        if name.contains(reserved) {
            return Err(NameError::Reserved {
                name: name.to_owned(),
                reserved,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for ok in ["vg1", "thin-pool-1", "a.b_c+d", "0", &"x".repeat(127)] {
            validate_lvm_name(ok).unwrap();
        }
    }

    #[test]
    fn rejects_names_lvm_would_misread() {
        assert_eq!(validate_lvm_name(""), Err(NameError::Empty));
        assert!(matches!(
            validate_lvm_name("-ffy"),
            Err(NameError::LeadingDash { .. })
        ));
        assert!(matches!(
            validate_lvm_name(".."),
            Err(NameError::Dots { .. })
        ));
        assert!(matches!(
            validate_lvm_name("a/b"),
            Err(NameError::BadChar { ch: '/', .. })
        ));
        assert!(matches!(
            validate_lvm_name("a b"),
            Err(NameError::BadChar { ch: ' ', .. })
        ));
        assert!(matches!(
            validate_lvm_name("vé"),
            Err(NameError::BadChar { .. })
        ));
        assert!(matches!(
            validate_lvm_name(&"x".repeat(128)),
            Err(NameError::TooLong { .. })
        ));
        assert!(matches!(
            validate_lvm_name("snapshot1"),
            Err(NameError::Reserved { .. })
        ));
        assert!(matches!(
            validate_lvm_name("pool_tmeta"),
            Err(NameError::Reserved { .. })
        ));
    }
}
