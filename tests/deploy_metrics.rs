//! deploy/'s alert rules and Grafana dashboard checked against the binary (issue 45): a live
//! service (tests/operator_support: a change source, a backup, a reservation and two
//! subscribers, one stalled) is scraped, and every metric and label that a rule or a panel
//! names must be on that page. A metric renamed or a label dropped fails here, naming it and
//! where it is used. The few series that come from Prometheus or the blackbox exporter rather
//! than the binary are listed in [`NOT_THE_BINARYS`].

mod operator_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use operator_support::{scene, STALLED};

/// Series a rule or panel may name that the binary does not export, each with who does.
const NOT_THE_BINARYS: &[(&str, &str)] = &[
    ("up", "Prometheus, for each scrape target"),
    (
        "probe_success",
        "the blackbox exporter probing /readyz (deploy/prometheus/prometheus.yml)",
    ),
];
/// Labels Prometheus adds to every scraped series (its target's).
const TARGET_LABELS: &[&str] = &["instance", "job"];

const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
];

/// The metric names and the label names a PromQL expression uses.
#[derive(Debug, Default)]
struct Names {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
}

/// Reads `expr` token by token: an identifier in braces before a matcher, or inside the
/// parentheses after `by`/`without`/`on`/`ignoring`/`group_*`, is a label; an identifier followed
/// by `(`, or by `by`/`without`, is a function or an aggregation; one after `$` a dashboard variable; quoted strings, numbers and
/// `[durations]` are skipped; any other identifier but a keyword is a metric.
fn names(expr: &str) -> Names {
    let mut out = Names::default();
    let chars: Vec<char> = expr.chars().collect();
    let (mut i, mut in_braces, mut label_list, mut after_grouping) = (0, false, false, false);
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            continue;
        }
        if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
            continue;
        }
        if c == '$' {
            i += 1;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            continue;
        }
        if c.is_ascii_digit() || (c == '.' && i + 1 < chars.len() && chars[i + 1].is_ascii_digit())
        {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace()).copied();
            if in_braces || label_list {
                out.labels.insert(word);
            } else if KEYWORDS.contains(&word.as_str()) {
                after_grouping = matches!(
                    word.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                );
            } else if next != Some('(') && !before_grouping(&chars[i..]) {
                out.metrics.insert(word);
            }
            continue;
        }
        match c {
            '{' => in_braces = true,
            '}' => in_braces = false,
            '(' if after_grouping => {
                label_list = true;
                after_grouping = false;
            }
            ')' => label_list = false,
            _ if !c.is_whitespace() => after_grouping = false,
            _ => {}
        }
        i += 1;
    }
    out
}

/// Whether the text after an identifier starts with `by` or `without`: then the identifier
/// is an aggregation (`max by (job) (…)`), not a metric.
fn before_grouping(rest: &[char]) -> bool {
    let word: String = rest
        .iter()
        .skip_while(|c| c.is_whitespace())
        .take_while(|c| c.is_ascii_alphanumeric() || **c == '_')
        .collect();
    word == "by" || word == "without"
}

/// `{{label}}` in a legend, `{{ $labels.label }}` in an annotation.
fn template_labels(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for part in text.split("{{").skip(1) {
        let inner = part.split("}}").next().unwrap_or_default().trim();
        let name = inner.strip_prefix("$labels.").unwrap_or(inner);
        let name = name.split_whitespace().next().unwrap_or_default();
        if !name.is_empty()
            && !name.starts_with('$')
            && name.chars().all(|c| c.is_alphanumeric() || c == '_')
        {
            out.insert(name.to_string());
        }
    }
    out
}

/// Each expression of `deploy/prometheus/alerts.yml` with the alert it belongs to: a one-line
/// `expr:` or a `expr: |` block (the more indented lines after it); annotations' `{{ $labels.x }}`
/// as well.
fn rule_expressions(yaml: &str) -> Vec<(String, String, BTreeSet<String>)> {
    let mut out: Vec<(String, String, BTreeSet<String>)> = Vec::new();
    let lines: Vec<&str> = yaml.lines().collect();
    let mut alert = String::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if let Some(name) = trimmed.strip_prefix("- alert:") {
            alert = name.trim().to_string();
        } else if let Some(rest) = trimmed.strip_prefix("expr:") {
            let rest = rest.trim();
            let expr = if rest == "|" || rest == ">" || rest == "|-" || rest == ">-" {
                let indent = line.len() - trimmed.len();
                let mut block = Vec::new();
                while i + 1 < lines.len() {
                    let next = lines[i + 1];
                    let next_indent = next.len() - next.trim_start().len();
                    if !next.trim().is_empty() && next_indent <= indent {
                        break;
                    }
                    block.push(next.trim());
                    i += 1;
                }
                block.join(" ")
            } else {
                rest.to_string()
            };
            out.push((alert.clone(), expr, BTreeSet::new()));
        } else if trimmed.starts_with("summary:") || trimmed.starts_with("description:") {
            if let Some(last) = out.last_mut() {
                last.2.extend(template_labels(trimmed));
            }
        }
        i += 1;
    }
    out
}

/// Each query of the dashboard with the panel (or variable) it belongs to, and the labels
/// its legend names.
fn dashboard_queries(json: &serde_json::Value) -> Vec<(String, String, BTreeSet<String>)> {
    let mut out = Vec::new();
    for panel in json["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or("?").to_string();
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .expect("a target has an expr")
                .to_string();
            let legend = template_labels(t["legendFormat"].as_str().unwrap_or_default());
            out.push((format!("panel {title:?}"), expr, legend));
        }
    }
    for var in json["templating"]["list"].as_array().into_iter().flatten() {
        let Some(q) = var["query"]["query"].as_str() else {
            continue;
        };
        // label_values(metric, label)
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable query {q:?} is not label_values(metric, label)"));
        let (metric, label) = inner.split_once(',').expect("label_values(metric, label)");
        out.push((
            format!("variable {}", var["name"]),
            metric.trim().to_string(),
            BTreeSet::from([label.trim().to_string()]),
        ));
    }
    out
}

/// Metric name → label names, as the page shows them.
fn exported(page: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => (&line[..i], &line[i..]),
            None => (line, ""),
        };
        let labels = out.entry(name.to_string()).or_default();
        if let Some(inner) = rest.strip_prefix('{').and_then(|r| r.split('}').next()) {
            for pair in inner.split(',') {
                if let Some((label, _)) = pair.split_once('=') {
                    labels.insert(label.trim().to_string());
                }
            }
        }
    }
    out
}

/// Every name used in `uses` that `page` does not have: one line each, naming where.
fn missing(
    uses: &[(String, String, BTreeSet<String>)],
    page: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (place, expr, extra_labels) in uses {
        let n = names(expr);
        let mut labels_here: BTreeSet<&str> = TARGET_LABELS.iter().copied().collect();
        for m in &n.metrics {
            if NOT_THE_BINARYS.iter().any(|(name, _)| name == m) {
                continue;
            }
            match page.get(m) {
                Some(labels) => labels_here.extend(labels.iter().map(String::as_str)),
                None => out.push(format!(
                    "{place}: metric {m} is not on /metrics (in `{expr}`)"
                )),
            }
        }
        let all_binarys = n.metrics.iter().all(|m| page.contains_key(m));
        for l in n.labels.iter().chain(extra_labels) {
            if all_binarys && !labels_here.contains(l.as_str()) {
                out.push(format!(
                    "{place}: label {l} is on none of its metrics (in `{expr}`)"
                ));
            }
        }
    }
    out
}

fn deploy(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn the_expression_reader_tells_metrics_labels_and_functions_apart() {
    let n = names(
        r#"max by (job, instance) (rate(a_total{reason="x", id=~"$id"}[5m])) > 0.5 and on (instance) b == 1 or sum without(mode) (c) / 1e3"#,
    );
    assert_eq!(
        n.metrics,
        BTreeSet::from(["a_total", "b", "c"].map(String::from))
    );
    assert_eq!(
        n.labels,
        BTreeSet::from(["job", "instance", "reason", "id", "mode"].map(String::from))
    );
    assert_eq!(
        template_labels("{{ $labels.id }} of {{ $labels.instance }}: {{ $value | humanizeDuration }}, {{backup}}"),
        BTreeSet::from(["id", "instance", "backup"].map(String::from))
    );
    let page = exported("# HELP a_total x\na_total{reason=\"r\"} 1\nb 2\n");
    let uses = vec![
        (
            "rule A".to_string(),
            "a_total{reason=\"r\"} and b".to_string(),
            BTreeSet::new(),
        ),
        (
            "rule B".to_string(),
            "a_totl > 0".to_string(),
            BTreeSet::new(),
        ),
        (
            "rule C".to_string(),
            "a_total{secret=\"1\"}".to_string(),
            BTreeSet::new(),
        ),
    ];
    assert_eq!(
        missing(&uses, &page),
        [
            "rule B: metric a_totl is not on /metrics (in `a_totl > 0`)",
            "rule C: label secret is on none of its metrics (in `a_total{secret=\"1\"}`)",
        ]
    );
}

#[actix_rt::test]
async fn every_metric_and_label_of_the_rules_and_the_dashboard_is_exported_by_the_binary() {
    let mut uses = rule_expressions(&deploy("prometheus/alerts.yml"));
    assert!(uses.len() >= 13, "{uses:?}");
    let dashboard: serde_json::Value =
        serde_json::from_str(&deploy("grafana/change-streamer.json")).expect("dashboard JSON");
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 20, "{queries:?}");
    uses.extend(queries);

    let s = scene(&[]).await;
    // The stalled subscriber's series and the backup's are on the page by now.
    let page = s.metrics().await;
    assert!(
        page.contains(&format!(
            "change_streamer_subscriber_lag_seconds{{id=\"{STALLED}\"}}"
        )),
        "{page}"
    );
    let page = exported(&page);
    let missing = missing(&uses, &page);
    s.stop().await;
    assert!(
        missing.is_empty(),
        "deploy/ names what the binary does not export:\n{}",
        missing.join("\n")
    );
    // And nothing outside the binary is used but what NOT_THE_BINARYS names.
    let outside: BTreeSet<String> = uses
        .iter()
        .flat_map(|(_, e, _)| names(e).metrics)
        .filter(|m| !page.contains_key(m))
        .collect();
    let allowed: BTreeSet<String> = NOT_THE_BINARYS.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(outside, allowed);
}
