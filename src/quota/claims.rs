//! What one DRA claim spec costs a queue: the `tessera plan` file format and the live
//! controller count claims with this one function, so both charge the same.
//!
//! Every device request counts `count` devices (1 when unset) of its `deviceClassName`;
//! both API shapes are read: `resource.k8s.io/v1` (`exactly`, or `firstAvailable[]`,
//! whose first alternative is counted) and `v1beta1` (`deviceClassName` on the
//! request). `allocationMode: All` has no count to charge and is refused. A vGPU slice
//! (`vgpu.gpu.tessera.io`) is also charged its capacity requests per device as HAMi's
//! quota resources: `memory` in MiB as `nvidia.com/gpumem`, `cores` as
//! `nvidia.com/gpucores`, so a queue capping them caps a pod written HAMi's way and its
//! DRA form alike. Pure: JSON in, counts out.

use std::collections::BTreeMap;

use serde_json::Value;

use super::quantity::Quantity;
use crate::vgpu::dra_claim::VGPU_DEVICE_CLASS;

/// Devices per device class, and vGPU shares per quota resource (`nvidia.com/gpumem`,
/// `nvidia.com/gpucores`), that a claim with `spec` (a ResourceClaimSpec: `devices`)
/// asks for. `Err`: which request is wrong and why.
pub fn claimed(spec: &Value) -> Result<BTreeMap<String, u32>, String> {
    let mut out = BTreeMap::new();
    let requests = spec["devices"]["requests"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    for (j, req) in requests.iter().enumerate() {
        let invalid = |why: &str| format!("devices.requests[{j}]: {why}");
        let one = if req["exactly"].is_object() {
            &req["exactly"]
        } else if let Some(first) = req["firstAvailable"].as_array().and_then(|a| a.first()) {
            first
        } else {
            req
        };
        let Some(class) = one["deviceClassName"].as_str() else {
            return Err(invalid("names no deviceClassName"));
        };
        if one["allocationMode"] == "All" {
            return Err(invalid(
                "allocationMode All has no device count to charge against quota",
            ));
        }
        let count = match &one["count"] {
            Value::Null => 1,
            v => v
                .as_u64()
                .filter(|n| *n >= 1)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| invalid("count is not a positive integer"))?,
        };
        add(&mut out, class, count);
        if class == VGPU_DEVICE_CLASS {
            for (resource, amount) in
                vgpu_shares(&one["capacity"]["requests"]).map_err(|e| invalid(&e))?
            {
                add(&mut out, resource, amount.saturating_mul(count));
            }
        }
    }
    Ok(out)
}

fn add(out: &mut BTreeMap<String, u32>, key: &str, n: u32) {
    let e = out.entry(key.to_string()).or_insert(0);
    *e = e.saturating_add(n);
}

/// A vGPU slice's capacity requests per device, as quota resources. A request without
/// them is charged none (the device's defaults are the node's to choose).
fn vgpu_shares(requests: &Value) -> Result<Vec<(&'static str, u32)>, String> {
    let mut out = Vec::new();
    for (key, resource, unit) in [
        ("memory", "nvidia.com/gpumem", 1i64 << 20),
        ("cores", "nvidia.com/gpucores", 1),
    ] {
        let Some(text) = requests[key].as_str() else {
            continue;
        };
        let q = Quantity::parse(text).map_err(|e| format!("capacity {key}: {e}"))?;
        let amount = u32::try_from(q.0 / 1000 / unit)
            .map_err(|_| format!("capacity {key} {text:?} is out of range"))?;
        out.push((resource, amount));
    }
    Ok(out)
}
