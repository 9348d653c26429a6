//! Overlapping communication with backward: an identity op per parameter whose backward sees that
//! parameter's finished gradient.
//!
//! Candle computes gradients node by node in reverse topological order. A node that is the only user of
//! a parameter receives, in its `bwd`, the parameter's complete gradient; [`GradHook`] hands it to its
//! [`OnGradient`] — for [`Ddp`](super::Ddp) the [`Synchronizer`](super::sync::Synchronizer), which
//! starts the all-reduce of a bucket as soon as all of its gradients are in, while backward goes on
//! with the layers below.
//!
//! Candle ops run eagerly, so a hooked weight is a copy made when the op is applied (as is a weight
//! cast for mixed precision). The backend remembers what it handed out ([`Handed`]): after every
//! optimizer step [`Ddp::refresh`](super::Ddp::refresh) copies the updated parameters into those
//! tensors in place, so a model built once trains on its current weights, exactly as one rebuilt
//! every step. A parameter asked for twice under one name (tied weights) is handed out as the same
//! tensor, so it has one hook, which sees the sum of its uses' gradients. And the hook checks, as
//! it passes the gradient on, that the weights the forward pass used are the parameter's current
//! values: a model that missed a refresh is an error naming what to do, never a silently frozen run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Device, InplaceOp2, Layout, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder, VarMap};

/// What a gradient hook does with a parameter's complete gradient in the backward pass, given the
/// parameter's index; an error fails the backward pass.
pub type OnGradient = Arc<dyn Fn(usize, &Tensor) -> candle_core::Result<()> + Send + Sync>;

/// What a [`GradHook`] hands the gradient to: like [`OnGradient`], and returns whether it took the
/// gradient. [`Ddp`](super::Ddp)'s takes the ones it copies into a bucket, whose average will
/// replace them; a gradient taken is not passed on to the parameter, where candle would add it to
/// a zero-filled gradient of the parameter's size (a memset and an add of every parameter, every
/// step) only for the averaged one to replace it. An [`OnGradient`] takes none.
pub(crate) type TakeGradient =
    Arc<dyn Fn(usize, &Tensor) -> candle_core::Result<bool> + Send + Sync>;

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
        on_gradient: Some(Arc::new(move |i, g: &Tensor| {
            on_gradient(i, g)?;
            Ok(false)
        })),
        compute: None,
        handed: Arc::default(),
        known_only: false,
    };
    VarBuilder::from_backend(Box::new(backend), dtype, device.clone())
}

/// Identity on the forward pass; on the backward pass, hands parameter `index`'s gradient to
/// `on_gradient`.
pub(crate) struct GradHook {
    pub index: usize,
    /// The parameter's name, for errors.
    pub name: String,
    pub on_gradient: TakeGradient,
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
        arg: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        if !same_samples(arg, res)? {
            candle_core::bail!(
                "kolo ddp: parameter {} of the model is not the parameter's current value: the \
                 model was built from Ddp::var_builder before an optimizer step that kolo did not \
                 see. Step with kolo's DistributedOptimizer (it refreshes the model), or call \
                 ddp.refresh() after your optimizer's step, or build the model anew each step",
                self.name
            )
        }
        let taken = (self.on_gradient)(self.index, grad)?;
        Ok((!taken).then(|| grad.clone()))
    }
}

/// Whether `a` and `b` (same shape and type, contiguous) agree at up to 64 places spread over them:
/// a weight copy that missed an optimizer step differs from the parameter almost everywhere. Only
/// checked on the CPU (elsewhere it would cost a device-to-host copy per parameter and step).
fn same_samples(a: &Tensor, b: &Tensor) -> candle_core::Result<bool> {
    use candle_core::Storage;
    let (sa, la) = a.storage_and_layout();
    let (sb, lb) = b.storage_and_layout();
    let (Some((a0, a1)), Some((b0, b1))) = (la.contiguous_offsets(), lb.contiguous_offsets())
    else {
        return Ok(true);
    };
    // Bit for bit: a copy is exact, and a NaN parameter equals its copy (`==` would say not).
    fn agree<T, B: PartialEq>(x: &[T], y: &[T], bits: impl Fn(&T) -> B) -> bool {
        let n = x.len().min(y.len());
        let step = (n / 64).max(1);
        let same = |i: usize| bits(&x[i]) == bits(&y[i]);
        (0..n).step_by(step).all(same) && (n == 0 || same(n - 1))
    }
    Ok(match (&*sa, &*sb) {
        (Storage::Cpu(CpuStorage::F32(x)), Storage::Cpu(CpuStorage::F32(y))) => {
            agree(&x[a0..a1], &y[b0..b1], |v| v.to_bits())
        }
        (Storage::Cpu(CpuStorage::F64(x)), Storage::Cpu(CpuStorage::F64(y))) => {
            agree(&x[a0..a1], &y[b0..b1], |v| v.to_bits())
        }
        _ => true,
    })
}

/// What a builder handed out for each parameter name: the tensors the model holds, into which
/// [`refresh`] copies the parameters' current values.
#[derive(Default)]
pub(crate) struct Handed {
    by_name: HashMap<String, HandedParam>,
}

struct HandedParam {
    /// The parameter (the `VarMap` variable).
    var: Tensor,
    /// Copies of it the model computes with: the hooked weight, the cast one (mixed precision).
    copies: Vec<Tensor>,
    /// What the model was given (the last of `copies`, or the variable itself).
    out: Tensor,
}

fn lock(h: &Mutex<Handed>) -> MutexGuard<'_, Handed> {
    h.lock().unwrap_or_else(|p| p.into_inner())
}

/// Copies every parameter's current value into the tensors handed out for it (casting where the
/// copy has another type), in place: a model built once computes with the updated weights.
pub(crate) fn refresh(handed: &Mutex<Handed>) -> candle_core::Result<()> {
    let h = lock(handed);
    for p in h.by_name.values() {
        for c in &p.copies {
            let src = if c.dtype() == p.var.dtype() {
                p.var.clone()
            } else {
                p.var.to_dtype(c.dtype())?
            };
            c.inplace_op2(&src, &CopyFrom)?;
        }
    }
    Ok(())
}

/// In-place copy of the second tensor into the first (same shape and type).
struct CopyFrom;

impl InplaceOp2 for CopyFrom {
    fn name(&self) -> &'static str {
        "kolo-ddp-refresh"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        src: &CpuStorage,
        sl: &Layout,
    ) -> candle_core::Result<()> {
        src.copy_strided_src(dst, dl.start_offset(), sl)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        dl: &Layout,
        src: &candle_core::CudaStorage,
        sl: &Layout,
    ) -> candle_core::Result<()> {
        src.copy_strided_src(dst, dl.start_offset(), sl)
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
    pub on_gradient: Option<TakeGradient>,
    /// Mixed precision: trainable parameters are handed out cast to this type (the `VarMap` keeps
    /// the f32 master weights, which receive the gradients through the cast); buffers stay as they
    /// are.
    pub compute: Option<DType>,
    /// What this builder handed out (shared with the [`Ddp`](super::Ddp), which refreshes it).
    pub handed: Arc<Mutex<Handed>>,
    /// Refuse a name the `VarMap` does not hold (instead of creating it): [`Ddp`](super::Ddp)'s
    /// builders, whose parameters are those the `VarMap` held when it was made.
    pub known_only: bool,
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
        if self.known_only && !self.contains_tensor(name) {
            candle_core::bail!(
                "kolo ddp: the model asks for `{name}`, which the VarMap given to Ddp::new does \
                 not hold, so no rank would synchronize, train or save it. Build the whole model \
                 once on the VarMap (VarBuilder::from_varmap) before Ddp::new, then again from \
                 Ddp::var_builder"
            )
        }
        let var = self.varmap.get(s, name, h, dtype, dev)?;
        let Some(&index) = self.index.get(name) else {
            return Ok(var);
        };
        let mut handed = lock(&self.handed);
        // Tied weights: the same tensor again, so one hook sees the sum of the uses' gradients.
        if let Some(p) = handed.by_name.get(name) {
            return Ok(p.out.clone());
        }
        let mut copies = Vec::new();
        let mut t = var.clone();
        if let Some(on_gradient) = &self.on_gradient {
            t = t.apply_op1_arc(Arc::new(Box::new(GradHook {
                index,
                name: name.to_string(),
                on_gradient: on_gradient.clone(),
            })))?;
            copies.push(t.clone());
        }
        if let Some(d) = self.compute.filter(|&d| d != t.dtype()) {
            t = t.to_dtype(d)?;
            copies.push(t.clone());
        }
        handed.by_name.insert(
            name.to_string(),
            HandedParam {
                var,
                copies,
                out: t.clone(),
            },
        );
        Ok(t)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A model over one hooked weight `w` (`[2]`): the loss `Σ w·x`, whose gradient is `x`.
    fn backward_through(handler: TakeGradient) -> candle_core::Result<Option<Vec<f32>>> {
        let dev = Device::Cpu;
        let varmap = VarMap::new();
        let backend = HookedBackend {
            varmap: varmap.clone(),
            index: HashMap::from([("w".to_string(), 0)]),
            on_gradient: Some(handler),
            compute: None,
            handed: Arc::default(),
            known_only: false,
        };
        let vb = VarBuilder::from_backend(Box::new(backend), DType::F32, dev.clone());
        let w = vb.get_with_hints(2, "w", Init::Const(1.0))?;
        let x = Tensor::new(&[3f32, -4.], &dev)?;
        let grads = (w * x)?.sum_all()?.backward()?;
        let var = varmap.all_vars().remove(0);
        grads.get(var.as_tensor()).map(|g| g.to_vec1()).transpose()
    }

    /// A copy of non-finite weights is the parameter's current value (NaN equals its copy bit
    /// for bit); a weight that missed an update is not.
    #[test]
    fn a_copy_of_nan_weights_is_current() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let w = Tensor::new(&[f32::NAN, 1.0, f32::INFINITY], &dev)?;
        assert!(same_samples(&w, &w.copy()?)?);
        let w64 = w.to_dtype(DType::F64)?;
        assert!(same_samples(&w64, &w64.copy()?)?);
        assert!(!same_samples(&w, &(w.clone() + 1.0)?)?);
        Ok(())
    }

    /// A gradient DDP's hook takes does not reach the parameter (no zero-filled gradient and add
    /// for it); one it leaves, and any an observing hook sees, does, whole.
    #[test]
    fn a_taken_gradient_is_not_passed_on() -> candle_core::Result<()> {
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        let take: TakeGradient = Arc::new(move |i, g| {
            assert_eq!((i, g.to_vec1::<f32>()?), (0, vec![3., -4.]));
            counter.fetch_add(1, Ordering::Relaxed);
            Ok(true)
        });
        assert_eq!(backward_through(take)?, None);
        let leave: TakeGradient = Arc::new(|_, _| Ok(false));
        assert_eq!(backward_through(leave)?, Some(vec![3., -4.]));
        // What `gradient_hooks` builds its hooks from: an observer, which takes nothing.
        let dev = Device::Cpu;
        let varmap = VarMap::new();
        let counter = seen.clone();
        let observe: OnGradient = Arc::new(move |_, _| {
            counter.fetch_add(1, Ordering::Relaxed);
            Ok(())
        });
        let vb = gradient_hooks(
            &varmap,
            HashMap::from([("w".to_string(), 0)]),
            observe,
            DType::F32,
            &dev,
        );
        let w = vb.get_with_hints(2, "w", Init::Const(1.0))?;
        let grads = (w * Tensor::new(&[3f32, -4.], &dev)?)?
            .sum_all()?
            .backward()?;
        let var = varmap.all_vars().remove(0);
        let g = grads
            .get(var.as_tensor())
            .map(|g| g.to_vec1::<f32>())
            .transpose()?;
        assert_eq!(g, Some(vec![3., -4.]));
        assert_eq!(seen.load(Ordering::Relaxed), 2);
        Ok(())
    }
}
