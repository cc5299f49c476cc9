//! The BERT network (embeddings and encoder layers, `BertModel` of transformers), computed op
//! for op as candle-transformers 0.11's `models::bert::BertModel` computes it, so outputs and
//! gradients are the same bits (a test compares them), with one parameter that model lacks: how
//! the layers' linear maps are computed ([`Linears`]: as loaded, or frozen with LoRA's
//! low-rank side paths).

use super::lowrank::{Linear, Linears, LinearsLoader};
use candle_core::{D, DType, Module, Tensor};
use candle_nn::{Embedding, LayerNorm, VarBuilder, embedding, layer_norm};
use candle_transformers::models::bert::{Config, HiddenAct};

struct Embeddings {
    word: Embedding,
    position: Embedding,
    token_type: Embedding,
    norm: LayerNorm,
}

impl Embeddings {
    fn load(vb: VarBuilder, c: &Config) -> candle_core::Result<Self> {
        Ok(Embeddings {
            word: embedding(c.vocab_size, c.hidden_size, vb.pp("word_embeddings"))?,
            position: embedding(c.max_position_embeddings, c.hidden_size, vb.pp("position_embeddings"))?,
            token_type: embedding(c.type_vocab_size, c.hidden_size, vb.pp("token_type_embeddings"))?,
            norm: layer_norm(c.hidden_size, c.layer_norm_eps, vb.pp("LayerNorm"))?,
        })
    }

    fn forward(&self, ids: &Tensor, type_ids: &Tensor) -> candle_core::Result<Tensor> {
        let (_, len) = ids.dims2()?;
        let words = self.word.forward(ids)?;
        let types = self.token_type.forward(type_ids)?;
        let positions: Vec<u32> = (0..len as u32).collect();
        let positions = Tensor::new(&positions[..], ids.device())?;
        let sum = (&words + types)?.broadcast_add(&self.position.forward(&positions)?)?;
        self.norm.forward(&sum)
    }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    act: HiddenAct,
    out: Linear,
    out_norm: LayerNorm,
    heads: usize,
    head_size: usize,
}

impl Layer {
    fn load(vb: VarBuilder, c: &Config, linears: &LinearsLoader) -> candle_core::Result<Self> {
        let (h, inter) = (c.hidden_size, c.intermediate_size);
        let head_size = h / c.num_attention_heads;
        let all = c.num_attention_heads * head_size;
        let (attention, output) = (vb.pp("attention"), vb.pp("output"));
        let (sa, ao) = (attention.pp("self"), attention.pp("output"));
        Ok(Layer {
            query: linears.load(h, all, sa.pp("query"))?,
            key: linears.load(h, all, sa.pp("key"))?,
            value: linears.load(h, all, sa.pp("value"))?,
            attention_out: linears.load(h, h, ao.pp("dense"))?,
            attention_norm: layer_norm(h, c.layer_norm_eps, ao.pp("LayerNorm"))?,
            intermediate: linears.load(h, inter, vb.pp("intermediate").pp("dense"))?,
            act: c.hidden_act,
            out: linears.load(inter, h, output.pp("dense"))?,
            out_norm: layer_norm(h, c.layer_norm_eps, output.pp("LayerNorm"))?,
            heads: c.num_attention_heads,
            head_size,
        })
    }

    /// `[batch, length, heads·size]` → `[batch, heads, length, size]`.
    fn split_heads(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut shape = x.dims().to_vec();
        shape.pop();
        shape.extend([self.heads, self.head_size]);
        x.reshape(shape.as_slice())?.transpose(1, 2)?.contiguous()
    }

    fn forward(&self, h: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let q = self.split_heads(&self.query.forward(h)?)?;
        let k = self.split_heads(&self.key.forward(h)?)?;
        let v = self.split_heads(&self.value.forward(h)?)?;
        let scores = (q.matmul(&k.t()?)? / (self.head_size as f64).sqrt())?.broadcast_add(mask)?;
        let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let context = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .flatten_from(D::Minus2)?;
        let attended = self
            .attention_norm
            .forward(&(self.attention_out.forward(&context)? + h)?)?;
        let inner = self.intermediate.forward(&attended)?;
        let inner = match self.act {
            HiddenAct::Gelu => inner.gelu_erf()?,
            HiddenAct::GeluApproximate => inner.gelu()?,
            HiddenAct::Relu => inner.relu()?,
        };
        self.out_norm.forward(&(self.out.forward(&inner)? + &attended)?)
    }
}

/// The BERT network: embeddings, then the encoder layers.
pub(super) struct BertNet {
    embeddings: Embeddings,
    layers: Vec<Layer>,
}

impl BertNet {
    fn load_at(vb: VarBuilder, c: &Config, linears: &Linears) -> candle_core::Result<Self> {
        let loader = LinearsLoader::new(linears);
        let embeddings = Embeddings::load(vb.pp("embeddings"), c)?;
        let layers = (0..c.num_hidden_layers)
            .map(|i| Layer::load(vb.pp(format!("encoder.layer.{i}")), c, &loader))
            .collect::<candle_core::Result<Vec<_>>>()?;
        loader.check_all_used()?;
        Ok(BertNet { embeddings, layers })
    }

    /// Loads the network from `vb` (names as transformers saves them; under `<model_type>.`,
    /// e.g. `bert.`, when they are not at the root, as candle-transformers reads them).
    pub(super) fn load(vb: VarBuilder, c: &Config, linears: &Linears) -> candle_core::Result<Self> {
        let vb = if vb.contains_tensor("bert") { vb.pp("bert") } else { vb };
        match Self::load_at(vb.clone(), c, linears) {
            Ok(net) => Ok(net),
            Err(e) => match &c.model_type {
                Some(t) => Self::load_at(vb.pp(t), c, linears).map_err(|_| e),
                None => Err(e),
            },
        }
    }

    /// The last hidden states, `[batch, length, hidden]`; `mask` (`[batch, length]`, 1 for
    /// tokens) defaults to every token.
    pub(super) fn forward(
        &self,
        ids: &Tensor,
        type_ids: &Tensor,
        mask: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let mut h = self.embeddings.forward(ids, type_ids)?;
        let mask = match mask {
            Some(m) => m.clone(),
            None => ids.ones_like()?,
        };
        let mask = extended_mask(&mask, h.dtype())?;
        for layer in &self.layers {
            h = layer.forward(&h, &mask)?;
        }
        Ok(h)
    }
}

/// `[batch, length]` (or `[batch, length, length]`) of 1 and 0 → an additive mask of 0 and the
/// dtype's lowest value, broadcast over heads and queries.
fn extended_mask(mask: &Tensor, dtype: DType) -> candle_core::Result<Tensor> {
    let mask = match mask.rank() {
        3 => mask.unsqueeze(1)?,
        2 => mask.unsqueeze(1)?.unsqueeze(1)?,
        _ => candle_core::bail!("the attention mask must be [batch, length] or [batch, length, length]"),
    };
    let mask = mask.to_dtype(dtype)?;
    (mask.ones_like()? - &mask)?.broadcast_mul(&Tensor::try_from(f32::MIN)?.to_device(mask.device())?.to_dtype(dtype)?)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::family::bert::SidePath;
    use candle_core::{Device, Var};
    use candle_transformers::models::bert::BertModel;
    use std::collections::HashMap;

    /// The config of a tiny random BERT: 2 layers, hidden 16 in 2 heads, intermediate 32.
    pub(in crate::family::bert) fn tiny_config() -> Config {
        serde_json::from_value(serde_json::json!({
            "vocab_size": 30, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 32, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "max_position_embeddings": 64, "type_vocab_size": 2, "initializer_range": 0.02,
            "layer_norm_eps": 1e-12, "pad_token_id": 0, "model_type": "bert",
        }))
        .unwrap()
    }

    /// Its weights, uniform in ±0.3 (norms' weights around 1) from `seed`, as variables.
    pub(in crate::family::bert) fn tiny_weights(c: &Config, seed: u64) -> Vec<(String, Var)> {
        let mut rng = mergescope_engine::rng::SplitMix64::new(seed);
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let mut shapes: Vec<(String, Vec<usize>)> = vec![
            ("embeddings.word_embeddings.weight".into(), vec![c.vocab_size, h]),
            (
                "embeddings.position_embeddings.weight".into(),
                vec![c.max_position_embeddings, h],
            ),
            (
                "embeddings.token_type_embeddings.weight".into(),
                vec![c.type_vocab_size, h],
            ),
            ("embeddings.LayerNorm.weight".into(), vec![h]),
            ("embeddings.LayerNorm.bias".into(), vec![h]),
        ];
        for l in 0..c.num_hidden_layers {
            for (m, o, n) in [
                ("attention.self.query", h, h),
                ("attention.self.key", h, h),
                ("attention.self.value", h, h),
                ("attention.output.dense", h, h),
                ("intermediate.dense", i, h),
                ("output.dense", h, i),
            ] {
                shapes.push((format!("encoder.layer.{l}.{m}.weight"), vec![o, n]));
                shapes.push((format!("encoder.layer.{l}.{m}.bias"), vec![o]));
            }
            for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
                shapes.push((format!("encoder.layer.{l}.{norm}.weight"), vec![h]));
                shapes.push((format!("encoder.layer.{l}.{norm}.bias"), vec![h]));
            }
        }
        shapes
            .into_iter()
            .map(|(name, shape)| {
                let base = if name.ends_with("LayerNorm.weight") { 1.0 } else { 0.0 };
                let n: usize = shape.iter().product();
                let v: Vec<f32> = (0..n)
                    .map(|_| (base + (rng.uniform() * 2.0 - 1.0) * 0.3) as f32)
                    .collect();
                let t = Tensor::from_vec(v, shape, &Device::Cpu).unwrap();
                (name, Var::from_tensor(&t).unwrap())
            })
            .collect()
    }

    /// Two padded inputs: ids, token types, mask.
    pub(in crate::family::bert) fn tiny_batch() -> (Tensor, Tensor, Tensor) {
        let d = Device::Cpu;
        let ids = Tensor::new(&[[2u32, 7, 9, 11, 3], [2, 5, 3, 0, 0]], &d).unwrap();
        let types = Tensor::new(&[[0u32, 0, 0, 1, 1], [0, 0, 0, 0, 0]], &d).unwrap();
        let mask = Tensor::new(&[[1u32, 1, 1, 1, 1], [1, 1, 1, 0, 0]], &d).unwrap();
        (ids, types, mask)
    }

    fn builder(vars: &[(String, Var)]) -> VarBuilder<'static> {
        let map: HashMap<String, Tensor> = vars.iter().map(|(k, v)| (k.clone(), v.as_tensor().clone())).collect();
        VarBuilder::from_tensors(map, DType::F32, &Device::Cpu)
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// A loss that weighs every hidden value differently.
    fn loss(h: &Tensor) -> Tensor {
        let n = h.elem_count();
        let w = (Tensor::arange(0u32, n as u32, &Device::Cpu)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            * 0.01)
            .unwrap()
            .cos()
            .unwrap()
            .reshape(h.shape())
            .unwrap();
        (h * w).unwrap().sqr().unwrap().sum_all().unwrap()
    }

    #[test]
    fn the_network_is_candle_transformers_bert_to_the_bit_and_frozen_maps_drop_only_their_weights_gradients() {
        let c = tiny_config();
        let vars = tiny_weights(&c, 3);
        let (ids, types, mask) = tiny_batch();
        let theirs = BertModel::load(builder(&vars), &c).unwrap();
        let want = theirs.forward(&ids, &types, Some(&mask)).unwrap();
        let want_grads = loss(&want).backward().unwrap();
        let ours = BertNet::load(builder(&vars), &c, &Linears::AsLoaded).unwrap();
        let got = ours.forward(&ids, &types, Some(&mask)).unwrap();
        assert_eq!(values(&got), values(&want));
        let grads = loss(&got).backward().unwrap();
        for (name, v) in &vars {
            let (g, w) = (grads.get(v.as_tensor()), want_grads.get(v.as_tensor()));
            assert_eq!(g.map(values), w.map(values), "{name}");
            assert!(g.is_some(), "{name} has a gradient");
        }
        // Frozen maps without side paths: the same outputs and the same gradients everywhere
        // but the layers' weights, which get none.
        let frozen = BertNet::load(builder(&vars), &c, &Linears::Frozen(HashMap::new())).unwrap();
        let got = frozen.forward(&ids, &types, Some(&mask)).unwrap();
        assert_eq!(values(&got), values(&want));
        let grads = loss(&got).backward().unwrap();
        for (name, v) in &vars {
            let g = grads.get(v.as_tensor());
            if name.starts_with("encoder.layer.") && name.ends_with("dense.weight")
                || ["query", "key", "value"]
                    .iter()
                    .any(|m| name.ends_with(&format!("self.{m}.weight")))
            {
                assert!(g.is_none(), "{name} is frozen");
            } else {
                assert_eq!(g.map(values), want_grads.get(v.as_tensor()).map(values), "{name}");
            }
        }
        // A side path must name a layer's linear map.
        let stray = SidePath {
            a: Tensor::zeros((1, 16), DType::F32, &Device::Cpu).unwrap(),
            b: Tensor::zeros((16, 1), DType::F32, &Device::Cpu).unwrap(),
            scale: 1.0,
        };
        let linears = Linears::Frozen([("encoder.layer.0.attention.self.querry".to_owned(), stray)].into());
        let e = BertNet::load(builder(&vars), &c, &linears).err().unwrap().to_string();
        assert!(e.contains("encoder.layer.0.attention.self.querry"), "{e}");
    }
}
