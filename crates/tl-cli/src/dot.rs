//! `tl graph`: a model's training step recorded by a `LinkedSession`, written as Graphviz DOT —
//! leaves as boxes (parameter name or "input"/"const", shape), op nodes as ellipses (the op with
//! its static parameters, output shape), edges from operands labelled with the operand position.

use std::fmt::Write as _;

use tl_ir::GraphData;
use tl_nn::Runtime;
use tl_session::LinkedSession;

use crate::cli::ModelName;
use crate::dataset::load;
use crate::model::Model;
use crate::{CliError, Result};

/// Record one training step's forward pass and loss of `model` on the first `batch` training
/// examples (all of them when `batch` is larger, as `tl train` makes one batch of them) in a
/// linked session and return its graph (handed over by `Runtime::record` before the pass ends;
/// nothing is evaluated or stepped). A `batch` of 0 is a usage error naming `--batch-size`.
pub fn record(model: ModelName, batch: usize) -> Result<GraphData> {
    if batch == 0 {
        return Err(CliError::usage("--batch-size 0: must be at least 1"));
    }
    let rt = Runtime::new(LinkedSession::<f32>::new());
    let m = Model::new(model, &rt)?;
    let (train, _, _) = load(model, None)?;
    let idx: Vec<usize> = (0..batch.min(train.len())).collect();
    let b = train.batch(&idx)?;
    let g = rt.record(
        &m,
        true,
        |g| Ok(m.forward(g, &b)?.loss),
        |s, _| Ok(s.graph().clone()),
    )?;
    Ok(g)
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The DOT text of `g` (named `name`).
pub fn to_dot(g: &GraphData, name: &str) -> String {
    let mut out = format!("digraph \"{}\" {{\n  rankdir=TB;\n", escape(name));
    out.push_str("  node [fontname=\"Helvetica\", fontsize=10];\n");
    for (id, leaf) in g.leaves().iter().enumerate() {
        let what = match (&leaf.name, leaf.requires_grad) {
            (Some(n), _) => n.clone(),
            (None, true) => "input (grad)".to_owned(),
            (None, false) => "input".to_owned(),
        };
        let style = if leaf.name.is_some() {
            "shape=box, style=filled, fillcolor=\"#dde8f8\""
        } else {
            "shape=box"
        };
        let _ = writeln!(
            out,
            "  n{id} [{style}, label=\"{}\\n{}\"];",
            escape(&what),
            leaf.shape
        );
    }
    let base = g.num_leaves();
    for (k, node) in g.nodes().iter().enumerate() {
        let id = base + k;
        let _ = writeln!(
            out,
            "  n{id} [shape=ellipse, label=\"{}\\n{}\"];",
            escape(&format!("{:?}", node.op())),
            node.shape()
        );
        let many = node.args().len() > 1;
        for (pos, a) in node.args().iter().enumerate() {
            if many {
                let _ = writeln!(out, "  n{a} -> n{id} [label=\"{pos}\", fontsize=8];");
            } else {
                let _ = writeln!(out, "  n{a} -> n{id};");
            }
        }
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlp_graph_has_named_parameters_ops_and_shapes() {
        let g = record(ModelName::Mlp, 4).unwrap();
        let dot = to_dot(&g, "mlp");
        assert!(dot.starts_with("digraph \"mlp\" {"));
        assert!(dot.trim_end().ends_with('}'));
        for want in ["0.weight", "2.bias", "[128, 64]", "[4, 64]", "[4, 10]"] {
            assert!(dot.contains(want), "missing {want:?} in\n{dot}");
        }
        // One line per leaf and node, one edge per operand.
        let edges: usize = g.nodes().iter().map(|n| n.args().len()).sum();
        assert_eq!(dot.matches(" -> ").count(), edges);
        assert_eq!(dot.matches("shape=").count(), g.len());
    }

    #[test]
    fn a_batch_of_zero_is_a_usage_error() {
        let e = record(ModelName::Mlp, 0).unwrap_err();
        assert!(e.is_usage(), "{e}");
        assert!(e.to_string().contains("--batch-size 0"), "{e}");
    }

    #[test]
    fn every_model_records_a_graph() {
        for (model, want) in [
            (ModelName::Cnn, ["3.weight", "maxPool", "crossEntropy"]),
            (
                ModelName::Fno,
                ["spectral.3.weight_im", "spectralConv1dRfft", "mseLoss"],
            ),
            (
                ModelName::Transformer,
                ["blocks.1.attn.wo", "multiHeadAttention", "layerNorm"],
            ),
        ] {
            let dot = to_dot(&record(model, 2).unwrap(), model.as_str());
            for w in want {
                assert!(dot.contains(w), "{model:?}: missing {w:?}");
            }
        }
    }
}
