//! Finding a CUDA device, never by panicking: the driver library's
//! presence is checked before cudarc touches it (cudarc panics where it is
//! missing), and the first context is made under `catch_unwind` (a driver
//! older than the API this build speaks panics on a missing symbol).

use crate::GpuError;

/// A device that answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its ordinal.
    pub ordinal: u32,
    /// Its name, as the driver gives it.
    pub name: String,
    /// Compute capability, major.
    pub major: i32,
    /// Compute capability, minor.
    pub minor: i32,
    /// Its memory, in bytes.
    pub memory_bytes: u64,
}

/// Device `ordinal`, or why there is none: a build without the `cuda`
/// feature, no driver, or the driver's refusal, each one sentence.
pub fn open(ordinal: u32) -> Result<DeviceInfo, GpuError> {
    #[cfg(feature = "cuda")]
    {
        cuda::open(ordinal)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ordinal;
        Err(GpuError::NotBuilt)
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::DeviceInfo;
    use crate::GpuError;
    use cudarc::driver::CudaContext;
    use cudarc::driver::sys::CUdevice_attribute as Attr;

    /// Whether the driver library loads.
    pub(super) fn driver_present() -> bool {
        // SAFETY: only tries to load the library by its candidate names;
        // nothing is called through it.
        #[allow(unsafe_code)]
        unsafe {
            cudarc::driver::sys::is_culib_present()
        }
    }

    pub(super) fn open(ordinal: u32) -> Result<DeviceInfo, GpuError> {
        if !driver_present() {
            return Err(GpuError::NoDriver);
        }
        let refused = |message: String| GpuError::Driver {
            device: ordinal,
            message,
        };
        let made = std::panic::catch_unwind(|| {
            let ctx = CudaContext::new(ordinal as usize).map_err(|e| e.to_string())?;
            let attr = |a| ctx.attribute(a).map_err(|e| e.to_string());
            let name = ctx.name().map_err(|e| e.to_string())?;
            let memory = ctx.total_mem().map_err(|e| e.to_string())?;
            Ok::<_, String>(DeviceInfo {
                ordinal,
                name,
                major: attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                minor: attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
                memory_bytes: memory as u64,
            })
        });
        match made {
            Ok(r) => r.map_err(refused),
            Err(p) => Err(refused(
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "the driver library is unusable".to_owned()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where no driver is installed (this test's machines), asking for a
    /// device is a clear error, not a panic; where one is, it answers.
    #[test]
    fn asking_for_a_device_never_panics() {
        match open(0) {
            Ok(d) => assert!(!d.name.is_empty()),
            Err(e) => {
                let text = e.to_string();
                assert!(!text.contains('\n'), "one sentence: {text}");
                #[cfg(not(feature = "cuda"))]
                assert!(matches!(e, GpuError::NotBuilt));
            }
        }
    }
}
