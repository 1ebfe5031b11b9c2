//! Generated code for the kubelet gRPC APIs in `proto/` (see `proto/README.md`).
//! Servers and clients both: the plugins serve, the test kubelet emulator dials.

#![allow(clippy::all, missing_docs)]

/// Device-plugin API v1beta1 (`/v1beta1.DevicePlugin/*`, `/v1beta1.Registration/*`).
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");
}

/// Plugin-watcher registration (`/pluginregistration.Registration/*`).
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// DRA kubelet plugin API.
pub mod dra {
    /// `k8s.io.kubelet.pkg.apis.dra.v1` (kubelet 1.34+).
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1`.
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
}

/// DRA device-health API (`DRAResourceHealth`).
pub mod dra_health {
    /// Package `v1alpha1` (kubelet 1.34).
    pub mod v1alpha1 {
        tonic::include_proto!("v1alpha1");
    }
    /// Package `v1beta1` (kubelet 1.35+).
    pub mod v1beta1 {
        include!(concat!(env!("OUT_DIR"), "/health/v1beta1.rs"));
    }
}

/// The kubelet's pod-resources API v1 (`/v1.PodResourcesLister/*`): which devices each
/// pod's containers hold.
pub mod podresources {
    tonic::include_proto!("v1");
}
