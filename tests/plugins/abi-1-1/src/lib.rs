//! ABI test fixture: a per-tensor plugin as an ABI 1.1 author wrote it. Its header says 1.1 and
//! it calls the method-specific fused operations (`trim_abs`, `elect_sign`, `disjoint_merge`,
//! `bernoulli_mask`, `low_rank`) through the fields of the core `HostApiV1` table, which ABI 1.2
//! keeps for such plugins (1.2 plugins take them from host extensions). Three modes:
//!
//! - `ties`: TIES with per-tensor trimming, k = round(density·n), mass election, dis-mean and
//!   θ0 + λ·τ_m, in the very order of calls the `ties` plugin makes for those settings, so the two
//!   must agree bit for bit;
//! - `dare`: θ0 + λ/(1 − p)·Σ_t m_t ⊙ τ_t with the mask of expert t drawn with seed `seed + t`;
//! - `low-rank`: θ0 + best rank-1 approximation of τ_1 (matrices only).

use mergescope_plugin_api::abi::{
    self, CAP_NEEDS_BASE, DISJOINT_MEAN, ELECT_MASS, HostApiV1, MAGIC, PluginApiV1, PluginHeader, Status, TensorHandle,
};
use mergescope_plugin_api::sdk::{StaticTable, build_table};
use mergescope_plugin_api::{
    CreateContext, Descriptor, Error, Host, MergeMethod, ParamSpec, Params, Result, Tensor, TensorInput, TensorMeta,
};
use std::sync::OnceLock;

/// The plugin's static header: ABI 1.1.
#[unsafe(no_mangle)]
#[used]
#[allow(non_upper_case_globals)]
pub static mergescope_plugin_header: PluginHeader = PluginHeader {
    magic: MAGIC,
    abi_major: abi::ABI_MAJOR,
    abi_minor: 1,
};

/// The v1 entry (the table's layout did not change in 1.2).
#[unsafe(no_mangle)]
pub extern "C" fn mergescope_plugin_entry_v1() -> *const PluginApiV1 {
    static TABLE: OnceLock<StaticTable> = OnceLock::new();
    &TABLE
        .get_or_init(|| build_table::<Fused>(env!("CARGO_PKG_VERSION")))
        .api
}

mergescope_plugin_api::choice_enum! {
    /// What the fixture computes.
    enum Mode {
        Ties = "ties",
        Dare = "dare",
        LowRank = "low-rank",
    }
}

/// The fixture method.
pub struct Fused {
    mode: Mode,
    density: f64,
    drop_rate: f64,
    lambda: f64,
    seed: u64,
}

/// Calls a core-table function that writes one handle.
fn call(f: impl FnOnce(&mut TensorHandle) -> Status) -> Result<Tensor> {
    let mut out = 0;
    match f(&mut out) {
        abi::STATUS_OK => Ok(Tensor(out)),
        s => Err(Error::Host(s)),
    }
}

impl Fused {
    fn ties(&self, host: &Host<'_>, api: &HostApiV1, base: Tensor, experts: &[Tensor]) -> Result<Tensor> {
        let n = host.numel(base)?;
        let k = (n as f64 * self.density).round().min(n as f64) as usize;
        if k == 0 {
            return host.affine(base, 1.0, 0.0);
        }
        let mut trimmed = Vec::new();
        for e in experts {
            let tau = host.sub(*e, base)?;
            let thr = host.kth_largest_abs(tau, k)?;
            if thr > 0.0 {
                // SAFETY: the core table's own context and a valid out pointer.
                trimmed.push(call(|o| unsafe { (api.trim_abs)(api.ctx, tau.0, thr, o) })?.0);
                host.release(tau)?;
            } else {
                trimmed.push(tau.0);
            }
        }
        // SAFETY: as above; `trimmed` holds live handles.
        let sign = call(|o| unsafe { (api.elect_sign)(api.ctx, trimmed.as_ptr(), trimmed.len(), ELECT_MASS, o) })?;
        let merged = call(|o| unsafe {
            // SAFETY: as above.
            (api.disjoint_merge)(api.ctx, trimmed.as_ptr(), trimmed.len(), sign.0, DISJOINT_MEAN, o)
        })?;
        host.release(sign)?;
        for t in trimmed {
            host.release(Tensor(t))?;
        }
        host.weighted_sum(&[base, merged], Some(&[1.0, self.lambda]))
    }

    fn dare(
        &self,
        host: &Host<'_>,
        api: &HostApiV1,
        tensor: &TensorMeta<'_>,
        base: Tensor,
        experts: &[Tensor],
    ) -> Result<Tensor> {
        let keep = 1.0 - self.drop_rate;
        let mut terms = vec![base];
        for (t, e) in experts.iter().enumerate() {
            let tau = host.sub(*e, base)?;
            let seed = self.seed + t as u64;
            // SAFETY: the core table's own context and a valid out pointer.
            let mask = call(|o| unsafe { (api.bernoulli_mask)(api.ctx, tau.0, keep, seed, tensor.offset, o) })?;
            terms.push(host.mul(mask, tau)?);
        }
        let mut weights = vec![1.0];
        weights.extend(std::iter::repeat_n(self.lambda / keep, experts.len()));
        host.weighted_sum(&terms, Some(&weights))
    }

    fn low_rank(
        host: &Host<'_>,
        api: &HostApiV1,
        tensor: &TensorMeta<'_>,
        base: Tensor,
        experts: &[Tensor],
    ) -> Result<Tensor> {
        let first = experts.first().ok_or("no experts")?;
        if tensor.full_shape.len() != 2 {
            return host.affine(*first, 1.0, 0.0);
        }
        let tau = host.sub(*first, base)?;
        // SAFETY: the core table's own context and a valid out pointer.
        let approx = call(|o| unsafe { (api.low_rank)(api.ctx, tau.0, 1, o) })?;
        host.add(base, approx)
    }
}

impl MergeMethod for Fused {
    fn descriptor() -> Descriptor {
        Descriptor {
            id: "mstest-abi-1-1",
            name: "Fixture: ABI 1.1 plugin",
            version: "",
            description: "ABI test fixture built for ABI 1.1, calling the fused operations of the core table.",
            help: "mode (ties, dare, low-rank), density, drop_rate and lambda: see the crate's documentation.",
            capabilities: CAP_NEEDS_BASE,
            params: vec![
                ParamSpec::choice_of("mode", Mode::Ties, "What to compute."),
                ParamSpec::float("density", 0.2, "TIES: fraction kept.").range(0.0, 1.0),
                ParamSpec::float("drop_rate", 0.5, "DARE: drop probability.").range(0.0, 0.99),
                ParamSpec::float("lambda", 1.0, "Scale of the merged task vector."),
            ],
        }
    }

    fn create(_host: &Host<'_>, params: &Params<'_>, ctx: CreateContext) -> Result<Self> {
        Ok(Fused {
            mode: params.choice_of("mode")?,
            density: params.float("density")?,
            drop_rate: params.float("drop_rate")?,
            lambda: params.float("lambda")?,
            seed: ctx.seed,
        })
    }

    fn merge_tensor(&mut self, host: &Host<'_>, input: &TensorInput<'_>) -> Result<Tensor> {
        let (tensor, experts) = (&input.meta, input.experts);
        let base = input.require_base("mstest-abi-1-1")?;
        let api = host.api();
        match self.mode {
            Mode::Ties => self.ties(host, api, base, experts),
            Mode::Dare => self.dare(host, api, tensor, base, experts),
            Mode::LowRank => Self::low_rank(host, api, tensor, base, experts),
        }
    }
}
