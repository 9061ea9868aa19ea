//! The replay's output: the JSON lines of one step, held until the step ends and then printed
//! in the peer's canonical order (cleanups first, then each reservation's events by
//! reservation number).

use std::cell::RefCell;
use std::rc::Rc;

use serde_json::json;

/// One output line, with what orders it within a step.
pub struct Event {
    pub res: u64,
    pub seq: usize,
    pub line: String,
}

#[derive(Default)]
pub struct Output {
    pub step: i64,
    pub at: i64,
    pub seq: usize,
    pub events: Vec<Event>,
}

pub type Out = Rc<RefCell<Output>>;

/// Appends an event; `fields` are (name, JSON text), written in this order after
/// `event`, `step` and `at`, as the peer writes them.
pub fn emit(out: &Out, res: u64, event: &str, fields: &[(&str, String)]) {
    let mut o = out.borrow_mut();
    let mut line = format!(
        "{{\"event\":{},\"step\":{},\"at\":{}",
        json!(event),
        o.step,
        o.at
    );
    for (k, v) in fields {
        line.push_str(&format!(",{}:{v}", json!(k)));
    }
    line.push('}');
    let seq = o.seq;
    o.seq += 1;
    o.events.push(Event { res, seq, line });
}

pub fn flush(out: &Out) {
    let mut o = out.borrow_mut();
    let mut events = std::mem::take(&mut o.events);
    events.sort_by_key(|e| (e.res, e.seq));
    for e in events {
        println!("{}", e.line);
    }
}
