//! The registry of one `/metrics` scrape: each metric of [`super::defs`] set to its value, as
//! its definition says (gauge or counter, with its labels), then rendered by the `prometheus`
//! crate's text encoder (the format and the label escaping are its).

use prometheus::core::Collector;
use prometheus::{Counter, CounterVec, Encoder, Gauge, GaugeVec, Opts, Registry, TextEncoder};

use super::defs::{Kind, Metric};

/// See the module documentation.
pub(super) struct Scrape {
    registry: Registry,
}

impl Default for Scrape {
    /// Starts with the process collector (`process_cpu_seconds_total`,
    /// `process_resident_memory_bytes`, `process_open_fds`, `process_start_time_seconds`…).
    fn default() -> Self {
        let registry = Registry::new();
        // Only fails on a name registered twice, which an empty registry cannot have.
        let _ = registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ));
        Scrape { registry }
    }
}

impl Scrape {
    fn add(&self, metric: impl Collector + 'static) -> prometheus::Result<()> {
        self.registry.register(Box::new(metric))
    }

    /// A metric without labels; a counter's total is kept elsewhere (by an actor).
    pub(super) fn set(&self, def: &Metric, value: f64) -> prometheus::Result<()> {
        if !def.labels.is_empty() {
            return Err(prometheus::Error::InconsistentCardinality {
                expect: def.labels.len(),
                got: 0,
            });
        }
        let opts = Opts::new(def.name, def.help);
        match def.kind {
            Kind::Gauge => {
                let g = Gauge::with_opts(opts)?;
                g.set(value);
                self.add(g)
            }
            Kind::Counter => {
                let c = Counter::with_opts(opts)?;
                c.inc_by(value);
                self.add(c)
            }
        }
    }

    /// A labelled metric: one sample per set of label values, in the order of `def.labels`.
    pub(super) fn set_each<'a, const N: usize>(
        &self,
        def: &Metric,
        samples: impl IntoIterator<Item = ([&'a str; N], f64)>,
    ) -> prometheus::Result<()> {
        let opts = Opts::new(def.name, def.help);
        match def.kind {
            Kind::Gauge => {
                let g = GaugeVec::new(opts, def.labels)?;
                for (values, v) in samples {
                    g.get_metric_with_label_values(&values)?.set(v);
                }
                self.add(g)
            }
            Kind::Counter => {
                let c = CounterVec::new(opts, def.labels)?;
                for (values, total) in samples {
                    c.get_metric_with_label_values(&values)?.inc_by(total);
                }
                self.add(c)
            }
        }
    }

    pub(super) fn render(&self) -> prometheus::Result<String> {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}
