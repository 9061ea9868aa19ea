//! How the service's log lines are written to stderr (PROTOCOL.md §2, Logs): `--log-format text`,
//! env_logger's own line, or `--log-format json`, one JSON object a line with `time`, `level`,
//! `target`, `message` and the line's own fields (`task`, `subscriber`, `backup`, `watermark`:
//! the `log` key-values its call site names).

use std::io::Write;

use log::kv::{Key, Value, VisitSource};

/// `--log-format` (PROTOCOL.md §2).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    // (Plain comments: a doc comment on a variant would switch `--help` to its long layout.)
    // env_logger's text line.
    #[default]
    Text,
    // One JSON object a line.
    Json,
}

/// Installs the logger on stderr: `RUST_LOG` chooses the level (`info` when unset), `format`
/// how each line is written.
pub fn init(format: LogFormat) {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    match format {
        // The text line is the message alone, as before the fields existed: they repeat it.
        LogFormat::Text => {
            builder.format_key_values(env_logger::fmt::hidden_kv_format);
        }
        LogFormat::Json => {
            builder.format(|buf, record| {
                let time = buf.timestamp_micros().to_string();
                writeln!(buf, "{}", json_line(&time, record))
            });
        }
    }
    builder.init();
}

/// The error a service that cannot start exits with, on stderr in `format` (PROTOCOL.md §2:
/// in `json`, one object like a log line's).
pub fn print_start_error(format: LogFormat, message: &str) {
    match format {
        LogFormat::Text => eprintln!("{message}"),
        LogFormat::Json => {
            let time = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
            let line = json_line(
                &time,
                &log::Record::builder()
                    .level(log::Level::Error)
                    .target("change_streamer")
                    .args(format_args!("{message}"))
                    .build(),
            );
            eprintln!("{line}");
        }
    }
}

/// One record as a JSON object: `time`, `level`, `target`, `message`, then its key-values (a
/// key that repeats one of the four is written as given, after them; readers keep the last).
pub fn json_line(time: &str, record: &log::Record<'_>) -> String {
    let mut out = String::with_capacity(128);
    out.push('{');
    push_field(&mut out, "time", time);
    out.push(',');
    push_field(&mut out, "level", record.level().as_str());
    out.push(',');
    push_field(&mut out, "target", record.target());
    out.push(',');
    push_field(&mut out, "message", &record.args().to_string());
    let mut fields = Fields(&mut out);
    // A visitor that only appends cannot fail.
    let _ = record.key_values().visit(&mut fields);
    out.push('}');
    out
}

fn push_field(out: &mut String, key: &str, value: &str) {
    out.push_str(&json_string(key));
    out.push(':');
    out.push_str(&json_string(value));
}

fn json_string(s: &str) -> String {
    // Serialising a `str` cannot fail.
    serde_json::to_string(s).unwrap_or_default()
}

/// Appends each key-value as `,"key":"value"` (the value as its `Display` shows it).
struct Fields<'a>(&'a mut String);

impl<'kvs> VisitSource<'kvs> for Fields<'_> {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), log::kv::Error> {
        self.0.push(',');
        push_field(self.0, key.as_str(), &value.to_string());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> serde_json::Value {
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    #[test]
    fn a_line_is_one_object_with_the_four_fields() {
        // One statement: the record borrows the temporaries of `format_args!`.
        let line = json_line(
            "2026-12-07T23:41:07.123456Z",
            &log::Record::builder()
                .level(log::Level::Warn)
                .target("change_streamer_actors::purger")
                .args(format_args!("quotes \" and\nnewlines {}", 1))
                .build(),
        );
        assert!(!line.contains('\n'), "{line}");
        let v = parse(&line);
        assert_eq!(v["time"], "2026-12-07T23:41:07.123456Z");
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["target"], "change_streamer_actors::purger");
        assert_eq!(v["message"], "quotes \" and\nnewlines 1");
    }

    #[test]
    fn the_fields_a_line_names_are_fields_of_the_object() {
        let kvs: [(&str, Value); 2] = [
            ("subscriber", Value::from("r1")),
            ("watermark", Value::from_display(&"0000000001s")),
        ];
        let record = log::Record::builder()
            .level(log::Level::Info)
            .target("t")
            .args(format_args!(
                "subscriber r1 accepted at watermark=0000000001s"
            ))
            .key_values(&kvs)
            .build();
        let v = parse(&json_line("t0", &record));
        assert_eq!(v["subscriber"], "r1");
        assert_eq!(v["watermark"], "0000000001s");
    }
}
