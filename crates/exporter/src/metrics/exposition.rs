//! A scrape's families encoded by prometheus-client: label escaping, sample
//! values, and counters with and without `_total`.

use std::fmt::Write as _;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, LabelSetEncoder, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;

/// Label pairs in the order they are written (DCGM's order first).
pub(super) type Labels = Vec<(&'static str, String)>;

/// Labels as prometheus-client writes them, with the text format's
/// escaping of `\`, `"` and newlines in values (the crate writes values
/// as they are).
struct LabelSet<'a>(&'a [(&'static str, String)]);

impl EncodeLabelSet for LabelSet<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        for (k, v) in self.0 {
            let mut label = encoder.encode_label();
            let mut key = label.encode_label_key()?;
            key.write_str(k)?;
            let mut value = key.encode_label_value()?;
            for c in v.chars() {
                match c {
                    '\\' => value.write_str("\\\\")?,
                    '"' => value.write_str("\\\"")?,
                    '\n' => value.write_str("\\n")?,
                    c => value.write_char(c)?,
                }
            }
            value.finish()?;
        }
        Ok(())
    }
}

/// Writes a sample value: integers without a fraction (`87`, not `87.0`),
/// the rest as prometheus-client writes an f64.
fn encode_value(e: &mut MetricEncoder, v: f64) -> Result<(), std::fmt::Error> {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        e.encode_gauge(&(v as i64))
    } else {
        e.encode_gauge(&v)
    }
}

fn sample(e: &mut MetricEncoder, counter: bool, v: f64) -> Result<(), std::fmt::Error> {
    if counter {
        e.encode_counter::<NoLabelSet, _, f64>(&(v as u64), None)
    } else {
        encode_value(e, v)
    }
}

/// One metric family of a scrape.
#[derive(Debug)]
struct FamilyOut {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: Vec<(Labels, f64)>,
}

impl FamilyOut {
    fn encode(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Our own counters end in `_total`, which prometheus-client appends
        // to the family's name. DCGM's counters do not, and keep their
        // names: declared counters, their samples written unsuffixed as
        // the DCGM exporter writes them.
        let (name, suffixed, ty) = match (self.kind, self.name.strip_suffix("_total")) {
            ("counter", Some(base)) => (base, true, MetricType::Counter),
            ("counter", None) => (self.name, false, MetricType::Counter),
            _ => (self.name, false, MetricType::Gauge),
        };
        let mut family = encoder.encode_descriptor(name, self.help, None, ty)?;
        for (labels, v) in &self.samples {
            // encode_family with no labels would write `name{} v`.
            if labels.is_empty() {
                sample(&mut family, suffixed, *v)?;
            } else {
                sample(&mut family.encode_family(&LabelSet(labels))?, suffixed, *v)?;
            }
        }
        Ok(())
    }
}

/// One scrape's families, encoded by prometheus-client on the scrape that
/// made them (the snapshot is read once per request, never cached).
#[derive(Debug, Default)]
pub(super) struct Exposition {
    families: Vec<FamilyOut>,
}

impl Exposition {
    pub(super) fn family(
        &mut self,
        name: &'static str,
        kind: &'static str,
        help: &'static str,
        samples: Vec<(Labels, f64)>,
    ) {
        if !samples.is_empty() {
            self.families.push(FamilyOut {
                name,
                kind,
                help,
                samples,
            });
        }
    }
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.families {
            f.encode(&mut encoder)?;
        }
        Ok(())
    }
}
