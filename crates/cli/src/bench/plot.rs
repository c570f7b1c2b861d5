//! The PNG of a suite: one panel per [`Plot`], medians as lines and points, min–max as whiskers.

use std::path::Path;
use std::sync::Once;

use anyhow::anyhow;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use super::harness::{Plot, Suite, Summary};

const PANEL: (u32, u32) = (760, 500);
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

fn register_fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font travels inside the binary: no system font is needed to draw a plot.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold());
    });
}

struct SeriesData {
    label: String,
    points: Vec<(f64, Summary)>,
}

/// Draws every plot of `suite` into one PNG at `path`.
pub fn render(suite: &Suite, path: &Path) -> anyhow::Result<()> {
    register_fonts();
    let n = suite.plots.len().max(1);
    let cols = if n == 1 { 1 } else { 2 };
    let rows = n.div_ceil(cols);
    let size = (PANEL.0 * cols as u32, PANEL.1 * rows as u32 + 44);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let (head, body) = root.split_vertically(44);
    head.draw(&Text::new(
        format!("daqflow bench {} — {}", suite.name, suite.title),
        (14, 12),
        ("sans-serif", 20).into_font().style(FontStyle::Bold),
    ))
    .map_err(|e| anyhow!("{e}"))?;
    let areas = body.split_evenly((rows, cols));
    for (plot, area) in suite.plots.iter().zip(areas.iter()) {
        let data: Vec<SeriesData> = plot
            .series
            .iter()
            .map(|s| SeriesData {
                label: s.label.clone(),
                points: suite
                    .series_points(plot, s)
                    .into_iter()
                    .filter(|(x, v)| (!plot.x_log || *x > 0.0) && (!plot.y_log || v.median > 0.0))
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        draw_plot(area, plot, &data)?;
    }
    root.present().map_err(|e| anyhow!("writing {}: {e}", path.display()))?;
    Ok(())
}

fn draw_plot<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    plot: &Plot,
    data: &[SeriesData],
) -> anyhow::Result<()> {
    let xs: Vec<f64> = data.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
    let ys: Vec<f64> = data.iter().flat_map(|s| s.points.iter().flat_map(|p| [p.1.min, p.1.max, p.1.median])).collect();
    if xs.is_empty() {
        area.draw(&Text::new(format!("{}: no data", plot.title), (20, 20), ("sans-serif", 16)))
            .map_err(|e| anyhow!("{e}"))?;
        return Ok(());
    }
    let (mut x0, mut x1) = (xs.iter().cloned().fold(f64::MAX, f64::min), xs.iter().cloned().fold(f64::MIN, f64::max));
    let (y_lo, y_hi) = (ys.iter().cloned().fold(f64::MAX, f64::min), ys.iter().cloned().fold(f64::MIN, f64::max));
    if x0 == x1 {
        x0 -= 0.5_f64.max(x0.abs() * 0.1);
        x1 += 0.5_f64.max(x1.abs() * 0.1);
    }
    if plot.x_log {
        x0 = x0.max(f64::MIN_POSITIVE) / 1.3;
        x1 *= 1.3;
    } else {
        let pad = (x1 - x0) * 0.05;
        x0 -= pad;
        x1 += pad;
    }
    let (y0, y1) = if plot.y_log {
        let lo = ys.iter().cloned().filter(|v| *v > 0.0).fold(f64::MAX, f64::min);
        (lo / 2.0, y_hi * 2.0)
    } else {
        (y_lo.min(0.0), if y_hi > 0.0 { y_hi * 1.15 } else { 1.0 })
    };
    let mut keys: Vec<f64> = xs.clone();
    keys.sort_by(|a, b| a.total_cmp(b));
    keys.dedup();
    let use_keys = keys.len() <= 12;
    macro_rules! go {
        ($x:expr, $y:expr) => {
            if use_keys {
                chart(area, $x.with_key_points(keys.clone()), $y, plot, data)
            } else {
                chart(area, $x, $y, plot, data)
            }
        };
    }
    match (plot.x_log, plot.y_log) {
        (false, false) => go!(Linear::new(x0, x1), Linear::new(y0, y1)),
        (true, false) => go!((x0..x1).log_scale(), Linear::new(y0, y1)),
        (false, true) => go!(Linear::new(x0, x1), (y0..y1).log_scale()),
        (true, true) => go!((x0..x1).log_scale(), (y0..y1).log_scale()),
    }
}

/// A linear f64 axis that accepts custom key points (plotters' own does not, for lack of a
/// default formatting; every label here goes through our formatters anyway).
struct Linear(plotters::coord::types::RangedCoordf64);

impl Linear {
    fn new(a: f64, b: f64) -> Self {
        Linear((a..b).into())
    }
}

impl plotters::coord::ranged1d::Ranged for Linear {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;
    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.0.map(value, limit)
    }
    fn key_points<H: plotters::coord::ranged1d::KeyPointHint>(&self, hint: H) -> Vec<f64> {
        self.0.key_points(hint)
    }
    fn range(&self) -> std::ops::Range<f64> {
        self.0.range()
    }
}

fn chart<DB, X, Y>(area: &DrawingArea<DB, Shift>, x: X, y: Y, plot: &Plot, data: &[SeriesData]) -> anyhow::Result<()>
where
    DB: DrawingBackend,
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e}");
    let mut chart = ChartBuilder::on(area)
        .caption(&plot.title, ("sans-serif", 17))
        .margin(14)
        .x_label_area_size(52)
        .y_label_area_size(78)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    let x_fmt = |v: &f64| if plot.x_bytes { crate::format::bytes(*v) } else { crate::format::si(*v) };
    let y_fmt = |v: &f64| crate::format::si(*v);
    chart
        .configure_mesh()
        .x_desc(&plot.x_label)
        .y_desc(&plot.y_label)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .y_labels(8)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 15))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    for (i, s) in data.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().map(|(x, v)| (*x, v.median)), color.stroke_width(2)))
            .map_err(err)?
            .label(s.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(3)));
        chart.draw_series(s.points.iter().map(|(x, v)| Circle::new((*x, v.median), 3, color.filled()))).map_err(err)?;
        chart
            .draw_series(
                s.points
                    .iter()
                    .filter(|(_, v)| v.max > v.min)
                    .map(|(x, v)| PathElement::new(vec![(*x, v.min), (*x, v.max)], color.stroke_width(1))),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(err)?;
    Ok(())
}
