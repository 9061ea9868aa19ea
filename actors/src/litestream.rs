//! Reading litestream's Prometheus `/metrics` page (PROTOCOL.md §8.1, §8.2).
//!
//! litestream (in the fork Zero uses) exports one gauge sample per database and replica,
//! `litestream_replica_progress{db,name,watermark}`, whose value is the unix time in seconds at
//! which that watermark was backed up to replica `name`. This module turns a page into
//! [`BackupSample`]s and a list of rejected samples, and nothing else: it knows neither clocks
//! nor scheduling. Parsing itself is `prometheus-parse`; every sample named
//! `litestream_replica_progress` counts whatever its `# TYPE` line says.

use crate::watermark::Watermark;

/// The gauge that carries backup progress.
pub const PROGRESS_METRIC: &str = "litestream_replica_progress";

/// One watermark that litestream reports as backed up.
#[derive(Debug, Clone, PartialEq)]
pub struct BackupSample {
    pub watermark: Watermark,
    /// The replica's `name` label (e.g. `s3`), empty when absent.
    pub replica: String,
    /// When the watermark was backed up, in unix milliseconds (sub-millisecond digits dropped).
    pub backed_up_at_ms: i64,
}

/// What one page yielded.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProgressPage {
    pub samples: Vec<BackupSample>,
    /// A one-line reason for each progress sample that was ignored.
    pub invalid: Vec<String>,
}

/// A page that cannot be read at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    #[error("the metrics page is not Prometheus text: {0} non-empty line(s) and no sample")]
    NoSamples(usize),
}

/// Parses a `/metrics` body.
///
/// An empty body yields nothing here; the monitor treats a page without any progress sample
/// as a poll error (PROTOCOL.md §8.1: stock litestream exports none). A non-empty body
/// without a single parseable sample is garbage and an error. Progress samples with an empty,
/// missing or non-LexiVersion `watermark`, or a value that is not a finite, non-negative
/// number, are reported in [`ProgressPage::invalid`], never returned as samples.
pub fn parse_progress_page(body: &str) -> Result<ProgressPage, PageError> {
    let lines: Vec<&str> = body.lines().collect();
    let scrape = prometheus_parse::Scrape::parse(lines.iter().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|_| prometheus_parse::Scrape {
            docs: Default::default(),
            samples: vec![],
        });
    let non_empty = lines.iter().filter(|l| !l.trim().is_empty()).count();
    if scrape.samples.is_empty() && non_empty > 0 {
        let has_only_comments = lines
            .iter()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'));
        if !has_only_comments {
            return Err(PageError::NoSamples(non_empty));
        }
    }

    let mut page = ProgressPage::default();
    let mut seen_progress = 0usize;
    for s in scrape
        .samples
        .iter()
        .filter(|s| s.metric == PROGRESS_METRIC)
    {
        seen_progress += 1;
        let value = match s.value {
            prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v)
            | prometheus_parse::Value::Counter(v) => v,
            _ => {
                page.invalid
                    .push(format!("{PROGRESS_METRIC} sample is not a plain value"));
                continue;
            }
        };
        let replica = s.labels.get("name").unwrap_or_default().to_string();
        let label = s.labels.get("watermark");
        let watermark = match label.map(Watermark::parse) {
            None => {
                page.invalid
                    .push(format!("no watermark label (replica {replica:?})"));
                continue;
            }
            Some(Err(e)) => {
                page.invalid.push(format!("{e} (replica {replica:?})"));
                continue;
            }
            Some(Ok(w)) => w,
        };
        if !value.is_finite() || value < 0.0 {
            page.invalid.push(format!(
                "watermark {watermark} has backup time {value}, not a finite non-negative number (replica {replica:?})"
            ));
            continue;
        }
        page.samples.push(BackupSample {
            watermark,
            replica,
            backed_up_at_ms: (value * 1000.0).trunc() as i64,
        });
    }
    // prometheus-parse silently skips a sample whose value is not a number: count those too.
    let progress_lines = lines
        .iter()
        .filter(|l| {
            let l = l.trim_start();
            l.starts_with(PROGRESS_METRIC)
                && l[PROGRESS_METRIC.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c == '{' || c.is_whitespace())
        })
        .count();
    for _ in seen_progress..progress_lines {
        page.invalid
            .push(format!("{PROGRESS_METRIC} sample with an unreadable value"));
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;
    use change_streamer_test_support::fixtures::litestream_page as fixture;

    #[test]
    fn reads_the_litestream_fork_page() {
        let page = parse_progress_page(&fixture("litestream-v0.3-fork.txt")).unwrap();
        assert_eq!(page.invalid, Vec::<String>::new());
        assert_eq!(
            page.samples,
            vec![BackupSample {
                watermark: Watermark::parse("618ocqq8").unwrap(),
                replica: "s3".into(),
                backed_up_at_ms: 1_745_456_444_765,
            }]
        );
    }

    #[test]
    fn reads_watermarks_from_two_replicas() {
        let page = parse_progress_page(&fixture("litestream-two-replicas.txt")).unwrap();
        let got: Vec<_> = page
            .samples
            .iter()
            .map(|s| (s.watermark.as_str(), s.replica.as_str(), s.backed_up_at_ms))
            .collect();
        assert_eq!(
            got,
            vec![
                ("618p0bw8", "file", 1_745_456_500_000),
                ("618ocqq8", "s3", 1_745_456_444_765)
            ]
        );
    }

    #[test]
    fn rejects_every_bad_watermark_and_time() {
        let page = parse_progress_page(&fixture("litestream-bad-watermarks.txt")).unwrap();
        assert!(page.samples.is_empty(), "{:?}", page.samples);
        assert_eq!(page.invalid.len(), 6, "{:#?}", page.invalid);
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(matches!(
            parse_progress_page(&fixture("litestream-garbage.txt")),
            Err(PageError::NoSamples(_))
        ));
        assert!(parse_progress_page("<html>oops</html>").is_err());
    }

    #[test]
    fn empty_page_and_unrelated_metrics_yield_nothing() {
        assert_eq!(parse_progress_page("").unwrap(), ProgressPage::default());
        let page = parse_progress_page("# TYPE go_goroutines gauge\ngo_goroutines 3\n").unwrap();
        assert!(page.samples.is_empty() && page.invalid.is_empty());
    }

    #[test]
    fn accepts_untyped_progress_and_counts_unreadable_values() {
        let body = "litestream_replica_progress{name=\"s3\",watermark=\"0a\"} 12.5\n\
                    litestream_replica_progress{name=\"s3\",watermark=\"0b\"} 17abc\n";
        let page = parse_progress_page(body).unwrap();
        assert_eq!(page.samples.len(), 1);
        assert_eq!(page.samples[0].backed_up_at_ms, 12_500);
        assert_eq!(page.invalid.len(), 1);
    }
}
