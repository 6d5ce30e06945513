//! Kubernetes names (apimachinery's IsQualifiedName, IsValidLabelValue, IsDNS1123Subdomain).

const LABEL_NAME_MAX: usize = 63;
const DNS_SUBDOMAIN_MAX: usize = 253;

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, without the length limit.
fn is_label_name_syntax(s: &str) -> bool {
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// A lowercase RFC 1123 subdomain of at most 253 characters: dot-separated labels of lowercase
/// letters, digits and `-`, each starting and ending with a letter or digit. The one check of it
/// (the webhook's label prefixes, the operator's CSI driver name).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= DNS_SUBDOMAIN_MAX
        && s.split('.').all(|label| {
            let bytes = label.as_bytes();
            match (bytes.first(), bytes.last()) {
                (Some(first), Some(last)) => {
                    let ok = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
                    ok(first) && ok(last) && bytes.iter().all(|b| ok(b) || *b == b'-')
                }
                _ => false,
            }
        })
}

/// Why `key` is not a Kubernetes qualified name (a label key), or `None` if it is one.
pub fn qualified_name_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        None => (None, key),
        Some((_, name)) if name.contains('/') => {
            return Some("it has more than one '/'".to_owned());
        }
        Some((prefix, name)) => (Some(prefix), name),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Some("the prefix before '/' is empty".to_owned());
        }
        if !is_dns1123_subdomain(prefix) {
            return Some(format!(
                "the prefix {prefix:?} is not a lowercase DNS subdomain of at most 253 characters"
            ));
        }
    }
    if name.is_empty() {
        return Some("the name is empty".to_owned());
    }
    if name.len() > LABEL_NAME_MAX {
        return Some(format!("the name has {} characters", name.len()));
    }
    if !is_label_name_syntax(name) {
        return Some(format!(
            "the name {name:?} has characters that are not allowed"
        ));
    }
    None
}

/// Why `value` is not a valid label value, or `None` if it is one (empty is valid).
pub fn label_value_problem(value: &str) -> Option<String> {
    if value.len() > LABEL_NAME_MAX {
        Some(format!("it has {} characters", value.len()))
    } else if !value.is_empty() && !is_label_name_syntax(value) {
        Some("it has characters that are not allowed".to_owned())
    } else {
        None
    }
}
