//! `fisher`: Fisher-weighted averaging (Matena & Raffel, NeurIPS 2022), a model-level method.
//! Each expert's parameters are weighted, element by element, by their diagonal Fisher
//! information on the expert's own task, computed by the host on the calibration data.

use mergescope_plugin_api::abi::{self, CAP_NEEDS_BASE};
use mergescope_plugin_api::model::{FisherLabelsChoice, ModelMethod, Session, Tasks, combine, json_number};
use mergescope_plugin_api::{CreateContext, Descriptor, Error, Host, ParamSpec, Params, Result, Tensor};

const HELP: &str = "Fisher-weighted averaging (Matena & Raffel, NeurIPS 2022).\n\
θ = Σ_t (F_t + ε) ⊙ θ_t / Σ_t (F_t + ε), element by element, where F_t is the diagonal Fisher \
information of expert t on its own task: the mean over that task's calibration examples (100 \
training images) of the squared gradient of log p(y | x), one example at a time, through the \
task's frozen head. labels chooses y: true (the empirical Fisher; the calibration data is \
labelled) or predicted (the expert's own argmax; uses no labels). normalize divides each F_t by \
its norm over the whole model first, so that no expert dominates by the scale of its gradients \
alone; ε = min_fisher keeps the weights positive where every Fisher vanishes (there the merge is \
the plain average, its limit for large ε).\n\
The run reports two iterates with their calibration loss: the uniform average and the Fisher \
merge. The base model is used by no formula; it is needed only to check compatibility.";

/// The Fisher-merging method.
pub struct Fisher {
    labels: abi::FisherLabels,
    normalize: bool,
    min_fisher: f64,
}

impl ModelMethod for Fisher {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "fisher",
            name: "Fisher merging",
            version: "",
            description: "Weights every parameter of every expert by its diagonal Fisher information.",
            help: HELP,
            capabilities: CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::choice_of(
                    "labels",
                    FisherLabelsChoice::True,
                    "y of log p(y|x): the calibration label, or the expert's prediction.",
                ),
                ParamSpec::bool("normalize", true, "Scale each expert's Fisher to unit norm first."),
                ParamSpec::float("min_fisher", 1e-6, "ε added to every Fisher weight.").range(0.0, 1e12),
            ],
        }
    }

    fn create(_host: &Host<'_>, p: &Params<'_>, _ctx: CreateContext) -> Result<Self> {
        Ok(Fisher {
            labels: p.choice_of::<FisherLabelsChoice>("labels")?.abi(),
            normalize: p.bool("normalize")?,
            min_fisher: p.float("min_fisher")?,
        })
    }

    fn run(&mut self, host: &Host<'_>, session: &Session<'_>) -> Result<Vec<Tensor>> {
        let n = session.expert_count();
        if n == 0 {
            return Err(Error::Message("Fisher merging needs at least one expert".into()));
        }
        let experts: Vec<Vec<Tensor>> = (0..n).map(|e| session.expert(e)).collect::<Result<_>>()?;
        let refs: Vec<&[Tensor]> = experts.iter().map(Vec::as_slice).collect();
        let average = combine(host, &refs, |_, _| 1.0 / n as f64)?;
        self.report(session, &average, "uniform average")?;
        let mut weights = Vec::with_capacity(n);
        for (t, expert) in experts.iter().enumerate() {
            host.check_cancelled()?;
            host.report_progress(t as f64 / n as f64);
            let fisher = session.diag_fisher(expert, t, self.labels)?;
            let scale = if self.normalize {
                let norm = fisher.iter().map(|f| host.dot(*f, *f)).sum::<Result<f64>>()?.sqrt();
                if norm > 0.0 { 1.0 / norm } else { 1.0 }
            } else {
                1.0
            };
            weights.push(
                fisher
                    .iter()
                    .map(|f| host.affine(*f, scale, self.min_fisher))
                    .collect::<Result<Vec<_>>>()?,
            );
        }
        let merged = (0..average.len())
            .map(|p| {
                let weighted = experts
                    .iter()
                    .zip(&weights)
                    .map(|(e, w)| host.mul(w[p], e[p]))
                    .collect::<Result<Vec<_>>>()?;
                let w: Vec<Tensor> = weights.iter().map(|w| w[p]).collect();
                let numerator = host.weighted_sum(&weighted, None)?;
                let denominator = host.weighted_sum(&w, None)?;
                if host.reduce(abi::REDUCE_MIN, denominator)? <= 0.0 {
                    return Err(Error::Message(format!(
                        "tensor {p}: every Fisher weight is 0 somewhere; set min_fisher above 0"
                    )));
                }
                host.div(numerator, denominator)
            })
            .collect::<Result<Vec<_>>>()?;
        host.report_progress(1.0);
        self.report(session, &merged, "fisher-weighted")?;
        Ok(merged)
    }
}

impl Fisher {
    /// Reports `candidate` with its mean calibration cross-entropy and accuracy over the tasks.
    fn report(&self, session: &Session<'_>, candidate: &[Tensor], label: &str) -> Result<()> {
        let m = session.evaluate(candidate, Tasks::All)?;
        session.report_iterate(
            candidate,
            label,
            &format!(
                "{{\"loss\":{},\"accuracy\":{}}}",
                json_number(m.loss),
                json_number(m.accuracy)
            ),
        )
    }
}

mergescope_plugin_api::export_model_plugin!(Fisher);
