//! Device patterns: csi-driver-lvm's `devicePattern`, a comma-separated list of Go `filepath.Glob`
//! patterns (ADR 0019). [`split`] cuts the list, [`Pattern::parse`] checks one pattern with Go's
//! `filepath.Match` syntax and [`Pattern::matches`] matches one path name against it.
//!
//! Syntax (Go's, with one difference): `*` matches any run of characters but `/`, `?` one character
//! but `/`, `[abc]`, `[a-z]` and `[^a-z]` a character class, `\` escapes the next character. A range
//! whose end is below its start, which Go accepts and never matches, is refused here: it is always a
//! typing error.

use std::fmt;

/// One item of a device pattern list, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    source: String,
    tokens: Vec<Token>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    /// `?`
    Any,
    /// `*`
    Star,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// Why a pattern does not compile: what is wrong, at which character (counted from 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError {
    pub position: usize,
    pub problem: &'static str,
}

impl fmt::Display for PatternError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at character {}", self.problem, self.position)
    }
}

/// The items of a comma-separated pattern list, trimmed, as csi-driver-lvm cuts its `--devices`
/// value. Empty items are kept (as `""`) so that validation can name them.
pub fn split(list: &str) -> Vec<&str> {
    list.split(',').map(str::trim).collect()
}

/// Whether `s` has a character that makes it a pattern rather than a plain path.
pub fn has_meta(s: &str) -> bool {
    s.contains(['*', '?', '[', '\\'])
}

/// Parses one `devicePatterns` item: every comma-separated pattern in it must be non-empty, an
/// absolute path under `/dev/` and compile. The error says which pattern is wrong and how.
pub fn parse_device_patterns(item: &str) -> Result<Vec<Pattern>, String> {
    split(item)
        .into_iter()
        .map(|p| {
            if p.is_empty() {
                return Err(format!(
                    "{item:?} has an empty pattern: remove the extra comma, or write a pattern such \
                     as /dev/nvme[0-9]n[0-9]"
                ));
            }
            if p.strip_prefix("/dev/").is_none_or(str::is_empty) {
                return Err(format!(
                    "{p:?} is not a device pattern: write an absolute pattern under /dev/, such as \
                     /dev/nvme[0-9]n[0-9] or /dev/disk/by-id/nvme-*"
                ));
            }
            Pattern::parse(p).map_err(|e| format!("{p:?} is not a valid pattern: {e}"))
        })
        .collect()
}

impl Pattern {
    /// Parses one pattern.
    pub fn parse(source: &str) -> Result<Self, PatternError> {
        let chars: Vec<char> = source.chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            match chars[i] {
                '*' => {
                    if tokens.last() != Some(&Token::Star) {
                        tokens.push(Token::Star);
                    }
                    i += 1;
                }
                '?' => {
                    tokens.push(Token::Any);
                    i += 1;
                }
                '\\' => {
                    let c = *chars.get(i + 1).ok_or(PatternError {
                        position: i,
                        problem: "a backslash ends the pattern (escape what with it?)",
                    })?;
                    tokens.push(Token::Literal(c));
                    i += 2;
                }
                '[' => {
                    let (token, next) = parse_class(&chars, i)?;
                    tokens.push(token);
                    i = next;
                }
                c => {
                    tokens.push(Token::Literal(c));
                    i += 1;
                }
            }
        }
        Ok(Self {
            source: source.to_owned(),
            tokens,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the whole of `name` matches, as Go's `filepath.Match` decides (`*` and `?` never
    /// match `/`).
    pub fn matches(&self, name: &str) -> bool {
        let name: Vec<char> = name.chars().collect();
        // Iterative matching with one backtrack point: the last `*` and where it started.
        let (mut t, mut n) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        loop {
            if t < self.tokens.len() {
                match &self.tokens[t] {
                    Token::Star => {
                        star = Some((t, n));
                        t += 1;
                        continue;
                    }
                    token if n < name.len() && token_matches(token, name[n]) => {
                        t += 1;
                        n += 1;
                        continue;
                    }
                    _ => {}
                }
            } else if n == name.len() {
                return true;
            }
            // Mismatch: let the last star take one more character, unless it would take a `/`.
            match star {
                Some((st, sn)) if sn < name.len() && name[sn] != '/' => {
                    star = Some((st, sn + 1));
                    t = st + 1;
                    n = sn + 1;
                }
                _ => return false,
            }
        }
    }
}

fn token_matches(token: &Token, c: char) -> bool {
    match token {
        Token::Literal(l) => *l == c,
        Token::Any => c != '/',
        Token::Star => unreachable!("stars are handled by the matcher"),
        Token::Class { negated, ranges } => {
            // Go's classes, unlike `?`, do not refuse the separator.
            ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated
        }
    }
}

/// Parses the class opening at `start` (a `[`); returns it and the index after its `]`.
fn parse_class(chars: &[char], start: usize) -> Result<(Token, usize), PatternError> {
    let unclosed = PatternError {
        position: start,
        problem: "a character class [ is not closed by ]",
    };
    let mut i = start + 1;
    let negated = chars.get(i) == Some(&'^');
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    loop {
        match chars.get(i) {
            None => return Err(unclosed),
            Some(']') if !ranges.is_empty() => {
                return Ok((Token::Class { negated, ranges }, i + 1));
            }
            _ => {}
        }
        let (lo, next) = class_char(chars, i, &unclosed)?;
        i = next;
        let mut hi = lo;
        if chars.get(i) == Some(&'-') {
            let (h, next) = class_char(chars, i + 1, &unclosed)?;
            if h < lo {
                return Err(PatternError {
                    position: i,
                    problem: "a range in a character class ends below its start (write [a-z], not [z-a])",
                });
            }
            hi = h;
            i = next;
        }
        ranges.push((lo, hi));
    }
}

/// One character of a class at `i` (escaped or not); `-` and `]` must be escaped there, as in Go.
fn class_char(
    chars: &[char],
    i: usize,
    unclosed: &PatternError,
) -> Result<(char, usize), PatternError> {
    match chars.get(i) {
        None => Err(unclosed.clone()),
        Some('\\') => chars
            .get(i + 1)
            .map(|c| (*c, i + 2))
            .ok_or_else(|| unclosed.clone()),
        Some('-' | ']') => Err(PatternError {
            position: i,
            problem: "a character class is empty or has an unescaped - or ] (escape them as \\- and \\])",
        }),
        Some(c) => Ok((*c, i + 1)),
    }
}

#[cfg(test)]
mod tests;
