//! A fresh subscriber's catch-up, timed, for `benches/catchup.sh`: it subscribes to the URL it
//! is given (a `/replication/v{N}/changes` URL with `wsBatched=true`, PROTOCOL.md §5, §7), reads
//! until the commit of `--until` arrives, acks only the frames that hold a `commit` (an applier
//! that acks once it has applied a whole transaction) or every frame (`--ack every`), and prints
//! one JSON line: `{"changes":N,"seconds":S,"changes_per_s":R}` (N: payloads received after the
//! `status`; S: from the connection's start to the last commit). Frames are split without a
//! JSON parser ([`frames`], shared with the load generator), so that the client costs little
//! beside the service it measures.
//!
//! `CATCHUP_URL` and `CATCHUP_UNTIL` may stand for `--url` and `--until`: any other client run by
//! the bench script (another language's, say) reads the same two variables and prints the
//! same line.

#[path = "../frames.rs"]
#[allow(dead_code)]
mod frames;

use std::time::Instant;

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

#[derive(Parser, Debug)]
#[command(about = "A fresh subscriber's catch-up, timed (benches/catchup.sh).")]
struct Args {
    /// The subscription URL (`ws://…/replication/v6/changes?…&wsBatched=true`); else
    /// `CATCHUP_URL`.
    #[arg(long)]
    url: Option<String>,
    /// The commit watermark that ends the catch-up (the change log's maxWatermark); else
    /// `CATCHUP_UNTIL`.
    #[arg(long)]
    until: Option<String>,
    /// Which frames to ack: `commits` (those holding a commit) or `every`.
    #[arg(long, default_value = "commits")]
    ack: String,
}

fn main() {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => fail(&format!("cannot start the runtime: {e}")),
    };
    if let Err(e) = rt.block_on(run(&args)) {
        fail(&e);
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("catchup-client: {msg}");
    std::process::exit(1);
}

async fn run(args: &Args) -> Result<(), String> {
    let every = match args.ack.as_str() {
        "commits" => false,
        "every" => true,
        other => return Err(format!("--ack: expected commits or every, got {other}")),
    };
    let given = |flag: &Option<String>, var: &str| {
        flag.clone()
            .or_else(|| std::env::var(var).ok())
            .ok_or_else(|| format!("neither --{} nor {var} is set", var[8..].to_lowercase()))
    };
    let url = given(&args.url, "CATCHUP_URL")?;
    let until = given(&args.until, "CATCHUP_UNTIL")?;
    let end = format!(r#""watermark":"{until}""#);
    let start = Instant::now();
    let config = WebSocketConfig::default()
        .max_message_size(Some(256 << 20))
        .max_frame_size(Some(256 << 20));
    let (mut ws, _) = tokio_tungstenite::connect_async_with_config(&url, Some(config), true)
        .await
        .map_err(|e| format!("connect {url}: {e}"))?;
    let mut changes = 0u64;
    loop {
        let text = match ws.next().await {
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(Message::Close(c))) => return Err(format!("closed: {c:?}")),
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(format!("read: {e}")),
            None => return Err("connection ended".into()),
        };
        let (mut commit, mut done) = (false, false);
        let mut count = |p: &str| {
            if p.starts_with(r#"["status""#) {
                return;
            }
            changes += 1;
            if p.starts_with(r#"["commit""#) {
                commit = true;
                done |= p.contains(&end);
            }
        };
        let id = if let Some((list, id)) = frames::split_batch(&text) {
            frames::payloads(list).for_each(&mut count);
            id
        } else if let Some((p, id)) = frames::split_frame(&text) {
            count(p);
            id
        } else {
            return Err(format!("unexpected frame: {:.200}", text.as_str()));
        };
        if done {
            let seconds = start.elapsed().as_secs_f64();
            println!(
                r#"{{"changes":{changes},"seconds":{seconds:.3},"changes_per_s":{:.0}}}"#,
                changes as f64 / seconds
            );
            let _ = ws.close(None).await;
            return Ok(());
        }
        if commit || every {
            ws.send(Message::Text(frames::ack_text(id).into()))
                .await
                .map_err(|e| format!("ack: {e}"))?;
        }
    }
}
