//! Counting what test runners report, one way for every task.

use std::{fmt, process::ExitCode};

use anyhow::{Result, bail};

/// Passed, failed and skipped tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
}

impl Counts {
    /// Adds up libtest summary lines (`test result: ok. 3 passed; 0 failed; 1 ignored; …`);
    /// ignored tests count as skipped.
    pub fn from_libtest(lines: &[String]) -> Self {
        let mut c = Self::default();
        for line in lines {
            for part in line.split([';', '.']) {
                let mut words = part.split_whitespace();
                if let (Some(n), Some(what)) = (words.next(), words.next()) {
                    let Ok(n) = n.parse::<u64>() else { continue };
                    match what {
                        "passed" => c.passed += n,
                        "failed" => c.failed += n,
                        "ignored" => c.skipped += n,
                        _ => {}
                    }
                }
            }
        }
        c
    }

    /// The counts of a line `… N passed, N failed, N skipped` (what every task prints last);
    /// `None` when the line has no such counts.
    pub fn from_closing_line(line: &str) -> Option<Self> {
        let (_, tail) = line.split_once(": ").unwrap_or(("", line));
        let mut c = Self::default();
        let mut seen = 0;
        for part in tail.split(',') {
            let mut words = part.split_whitespace();
            let (Some(n), Some(what)) = (words.next(), words.next()) else {
                return None;
            };
            let n = n.parse::<u64>().ok()?;
            match what {
                "passed" => c.passed = n,
                "failed" => c.failed = n,
                "skipped" => c.skipped = n,
                _ => return None,
            }
            seen += 1;
        }
        (seen >= 2).then_some(c)
    }

    pub fn add(&mut self, other: Self) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.skipped += other.skipped;
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )
    }
}

/// The exit code of a guest command (`None`: the VM died or timed out before it wrote one).
pub fn exit_from(code: Option<i32>) -> Result<ExitCode> {
    match code {
        Some(c) => Ok(ExitCode::from(u8::try_from(c).unwrap_or(1))),
        None => bail!("the VM did not report an exit status (it crashed or timed out)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_summaries_are_added_up_with_ignored_as_skipped() {
        let lines = vec![
            "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.1s".to_owned(),
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 5 filtered out".to_owned(),
        ];
        assert_eq!(
            Counts::from_libtest(&lines),
            Counts {
                passed: 5,
                failed: 1,
                skipped: 1
            }
        );
    }

    #[test]
    fn closing_lines_are_read_back_and_other_lines_are_not() {
        assert_eq!(
            Counts::from_closing_line("vm-suite: 119 passed, 0 failed, 2 skipped"),
            Some(Counts {
                passed: 119,
                failed: 0,
                skipped: 2
            })
        );
        assert_eq!(
            Counts::from_closing_line(
                &Counts {
                    passed: 4,
                    failed: 1,
                    skipped: 0
                }
                .to_string()
            ),
            Some(Counts {
                passed: 4,
                failed: 1,
                skipped: 0
            })
        );
        assert_eq!(
            Counts::from_closing_line("e2e: node VM up after 40 s"),
            None
        );
        assert_eq!(Counts::from_closing_line("deps: all present"), None);
    }
}
