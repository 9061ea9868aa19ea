//! The soak's picture: `RssAnon` (top) and open fds (bottom) of the service over the run, one
//! line per life of the process, a grey rule at each `kill -9`. Drawn with `plotters`' bitmap
//! backend (pure Rust, PNG). Text needs a font: the DejaVu Sans file of the system when it is
//! there (read at run time, nothing vendored); without it the plot is drawn without any text.

use plotters::prelude::*;

use crate::sample::Sample;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Registers the system font for plotters; whether there is one.
fn font() -> bool {
    let Ok(bytes) = std::fs::read(FONT) else {
        return false;
    };
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
}

type Err = Box<dyn std::error::Error>;

/// One line of a panel: its legend, its colour, and what it plots of a sample.
type Series<'a> = (&'a str, RGBColor, &'a dyn Fn(&Sample) -> f64);

/// One panel: `series` (name, colour, value) of `samples`, by life.
fn panel(
    area: &DrawingArea<BitMapBackend, plotters::coord::Shift>,
    text: bool,
    caption: &str,
    y_desc: &str,
    samples: &[Sample],
    restarts: &[f64],
    series: &[Series],
) -> Result<(), Err> {
    let t_max = samples.last().map_or(1.0, |s| s.t).max(1.0);
    let y_max = samples
        .iter()
        .flat_map(|s| series.iter().map(move |(_, _, f)| f(s)))
        .fold(1.0f64, f64::max)
        * 1.15;
    let mut builder = ChartBuilder::on(area);
    builder.margin(12);
    if text {
        builder
            .caption(caption, ("sans-serif", 20))
            .x_label_area_size(35)
            .y_label_area_size(60);
    }
    let mut chart = builder.build_cartesian_2d(0f64..t_max, 0f64..y_max)?;
    if text {
        chart
            .configure_mesh()
            .x_desc("seconds since the start")
            .y_desc(y_desc)
            .draw()?;
    } else {
        chart
            .configure_mesh()
            .x_labels(0)
            .y_labels(0)
            .disable_mesh()
            .draw()?;
    }
    for &t in restarts {
        chart.draw_series(LineSeries::new(
            [(t, 0.0), (t, y_max)],
            RGBColor(190, 190, 190),
        ))?;
    }
    let lives = samples.iter().map(|s| s.life).max().map_or(0, |l| l + 1);
    for (i, (name, colour, value)) in series.iter().enumerate() {
        for life in 0..lives {
            let points = samples
                .iter()
                .filter(|s| s.life == life)
                .map(|s| (s.t, value(s)));
            let drawn = chart.draw_series(LineSeries::new(points, colour.stroke_width(2)))?;
            if text && life == 0 {
                let c = *colour;
                drawn.label(*name).legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2))
                });
            }
        }
        let _ = i;
    }
    if text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()?;
    }
    Ok(())
}

/// Writes the PNG to `path`; `title` heads the top panel.
pub fn draw(
    path: &std::path::Path,
    title: &str,
    samples: &[Sample],
    restarts: &[f64],
) -> Result<(), Err> {
    let text = font();
    let root = BitMapBackend::new(path, (1200, 800)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(400);
    panel(
        &top,
        text,
        title,
        "RssAnon (MiB)",
        samples,
        restarts,
        &[("RssAnon (MiB)", RGBColor(200, 30, 30), &|s: &Sample| {
            s.rss_anon_kb as f64 / 1024.0
        })],
    )?;
    panel(
        &bottom,
        text,
        "open file descriptors of the service",
        "fds",
        samples,
        restarts,
        &[
            ("open fds", RGBColor(30, 60, 200), &|s: &Sample| {
                s.fds as f64
            }),
            (
                "fds less the soak's open sockets",
                RGBColor(20, 150, 60),
                &|s: &Sample| s.own_fds() as f64,
            ),
            (
                "the soak's open sockets",
                RGBColor(150, 150, 150),
                &|s: &Sample| s.sockets as f64,
            ),
        ],
    )?;
    root.present()?;
    Ok(())
}
