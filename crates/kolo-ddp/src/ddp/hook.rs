//! Overlapping communication with backward: an identity op per parameter whose backward sees that
//! parameter's finished gradient.
//!
//! Candle computes gradients node by node in reverse topological order. A node that is the only user of
//! a parameter receives, in its `bwd`, the parameter's complete gradient; [`GradHook`] hands it to its
//! [`OnGradient`] — for [`Ddp`](super::Ddp) the [`Synchronizer`](super::sync::Synchronizer), which
//! starts the all-reduce of a bucket as soon as all of its gradients are in, while backward goes on
//! with the layers below.
//!
//! Candle ops run eagerly, so a hooked weight is a copy made when the op is applied: the model must be
//! built from [`HookedBackend`] for every step (building a model only wraps tensors; the copies cost one
//! memcpy of the parameters).

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder, VarMap};

/// What a gradient hook does with a parameter's complete gradient in the backward pass, given the
/// parameter's index; an error fails the backward pass.
pub type OnGradient = Arc<dyn Fn(usize, &Tensor) -> candle_core::Result<()> + Send + Sync>;

/// A `VarBuilder` over `varmap` whose trainable parameters — the names in `index`, with their
/// indices — come wrapped in an identity op whose backward pass hands the parameter's complete
/// gradient to `on_gradient`: the hook [`Ddp`](super::Ddp) starts its bucket all-reduces from, for
/// other uses (e.g. timing when each gradient is ready). Other variables (buffers) come as they
/// are. Build the model from it for every step: a hooked parameter is a copy made when the model
/// is built (one memcpy of the parameters).
pub fn gradient_hooks(
    varmap: &VarMap,
    index: HashMap<String, usize>,
    on_gradient: OnGradient,
    dtype: DType,
    device: &Device,
) -> VarBuilder<'static> {
    let backend = HookedBackend {
        varmap: varmap.clone(),
        index,
        on_gradient: Some(on_gradient),
        compute: None,
    };
    VarBuilder::from_backend(Box::new(backend), dtype, device.clone())
}

/// Identity on the forward pass; on the backward pass, hands parameter `index`'s gradient to
/// `on_gradient`.
pub(crate) struct GradHook {
    pub index: usize,
    pub on_gradient: OnGradient,
}

fn copy_contiguous<T: Copy>(v: &[T], layout: &Layout) -> candle_core::Result<Vec<T>> {
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(v[a..b].to_vec()),
        None => candle_core::bail!("kolo ddp: a parameter is not contiguous"),
    }
}

impl CustomOp1 for GradHook {
    fn name(&self) -> &'static str {
        "kolo-ddp-grad-hook"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let out = match s {
            CpuStorage::F32(v) => CpuStorage::F32(copy_contiguous(v, l)?),
            CpuStorage::F64(v) => CpuStorage::F64(copy_contiguous(v, l)?),
            _ => candle_core::bail!("kolo ddp: parameters must be f32 or f64"),
        };
        Ok((out, l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        // A `VarMap` variable is its own contiguous storage: the copy is the whole buffer.
        if !l.is_contiguous() || l.start_offset() != 0 {
            candle_core::bail!("kolo ddp: a parameter is not contiguous")
        }
        Ok((s.try_clone(l)?, l.shape().clone()))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        (self.on_gradient)(self.index, grad)?;
        Ok(Some(grad.clone()))
    }
}

/// A `VarBuilder` backend over the model's `VarMap` that wraps every trainable parameter in a
/// [`GradHook`] (buffers such as BatchNorm running statistics are passed through unwrapped, so updates
/// to them reach the `VarMap`).
pub(crate) struct HookedBackend {
    pub varmap: VarMap,
    /// Parameter name → index, for the trainable parameters.
    pub index: HashMap<String, usize>,
    /// `None`: no hooks (gradients are averaged after backward, or not at all).
    pub on_gradient: Option<OnGradient>,
    /// Mixed precision: trainable parameters are handed out cast to this type (the `VarMap` keeps
    /// the f32 master weights, which receive the gradients through the cast); buffers stay as they
    /// are.
    pub compute: Option<DType>,
}

impl SimpleBackend for HookedBackend {
    fn get(
        &self,
        s: Shape,
        name: &str,
        h: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let t = self.varmap.get(s, name, h, dtype, dev)?;
        let Some(&index) = self.index.get(name) else {
            return Ok(t);
        };
        let t = match &self.on_gradient {
            Some(on_gradient) => t.apply_op1_arc(Arc::new(Box::new(GradHook {
                index,
                on_gradient: on_gradient.clone(),
            })))?,
            None => t,
        };
        match self.compute {
            Some(d) if d != t.dtype() => t.to_dtype(d),
            _ => Ok(t),
        }
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("kolo ddp: parameter {name} must be created with a shape")
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.varmap
            .data()
            .lock()
            .map(|d| d.contains_key(name))
            .unwrap_or(false)
    }
}
