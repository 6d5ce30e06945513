//! An in-memory [`Backend`] that behaves like LVM where the CSI contract can tell: extents of 4 MiB,
//! thin capacity from an overprovision ratio, thick capacity from free extents, snapshots of thin
//! volumes only, sources in the same class. The CSI contract tests and the node agent's reconciler
//! tests run against it; every call is recorded ([`FakeBackend::calls`]).

use std::{collections::BTreeMap, sync::Mutex, time::Duration};

use lvms_core::{layout::FreeSpace, lvattr::LvHealth};
use lvms_engine::{
    backend::{
        Backend, BackendError, Capacity, DeviceClassConfig, NewSnapshot, NewVolume, Result, Source,
        Volume,
    },
    ids,
};

pub const EXTENT: u64 = 4 << 20;
pub const NODE: &str = "node-a";

#[derive(Debug, Default)]
pub struct State {
    pub volumes: BTreeMap<String, Volume>,
    /// Free bytes of each thick class's VG.
    pub thick_free: BTreeMap<String, u64>,
    /// How many equal devices each thick class's free bytes are spread over (none: one).
    pub thick_devices: BTreeMap<String, u64>,
    /// The layout each volume was made with (by id), as the backend was asked.
    pub layouts: BTreeMap<String, lvms_engine::backend::Layout>,
    /// Pool size of each thin class.
    pub pool_size: BTreeMap<String, u64>,
    pub create_delay: Duration,
    /// `create_volume` calls running now, and the most that ever ran at once.
    pub creating: usize,
    pub most_creating: usize,
    pub calls: Vec<String>,
    /// What [`Backend::usage`] answers per class (none unless a test sets it).
    pub usage: BTreeMap<String, lvms_engine::backend::Usage>,
    /// Volumes another driver made, by id: [`Backend::get`] does not see them until
    /// [`Backend::take_over`] moves them to `volumes`.
    pub foreign: BTreeMap<String, Volume>,
}

pub struct FakeBackend {
    classes: Vec<DeviceClassConfig>,
    /// Classes configured but not served, with why ([`Backend::unserved`]).
    unserved: Vec<(DeviceClassConfig, String)>,
    pub state: Mutex<State>,
}

impl Default for FakeBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeBackend {
    /// Thin class `thin` (pool 4 GiB, ratio 2, default) and thick class `thick` (1 GiB free).
    pub fn new() -> Self {
        let mut state = State::default();
        state.pool_size.insert("thin".into(), 4 << 30);
        state.thick_free.insert("thick".into(), 1 << 30);
        Self {
            classes: vec![
                DeviceClassConfig::named("thin")
                    .with_thin_pool("pool", 2)
                    .as_default(),
                DeviceClassConfig::named("thick"),
            ],
            unserved: Vec::new(),
            state: Mutex::new(state),
        }
    }

    /// The same backend with one more thin class, `class`, its pool `pool_size` bytes (ratio 2).
    #[must_use]
    pub fn with_thin_class(mut self, class: &str, pool_size: u64) -> Self {
        self.classes
            .push(DeviceClassConfig::named(class).with_thin_pool("pool", 2));
        self.state
            .lock()
            .unwrap()
            .pool_size
            .insert(class.into(), pool_size);
        self
    }

    /// The same backend with `class` configured but not served, for `reason`.
    #[must_use]
    pub fn with_unserved(mut self, class: DeviceClassConfig, reason: &str) -> Self {
        self.unserved.push((class, reason.to_owned()));
        self
    }

    /// The same backend with thick `class`'s free space spread evenly over `devices` devices, so
    /// that striped and mirrored layouts fit.
    pub fn with_devices(self, class: &str, devices: u64) -> Self {
        self.state
            .lock()
            .unwrap()
            .thick_devices
            .insert(class.to_owned(), devices.max(1));
        self
    }

    /// Thick `class`'s free space as devices of equal free extents.
    fn free_of(s: &State, class: &str) -> Option<FreeSpace> {
        let free = *s.thick_free.get(class)?;
        let devices = s.thick_devices.get(class).copied().unwrap_or(1);
        let each = free / EXTENT / devices;
        Some(FreeSpace::new(
            EXTENT,
            (0..devices).map(|_| each * EXTENT).collect::<Vec<_>>(),
        ))
    }

    /// The same backend with `class`'s filesystem set to `fstype`.
    pub fn with_fstype(mut self, class: &str, fstype: lvms_core::config::Fstype) -> Self {
        for c in self.classes.iter_mut().filter(|c| c.name == class) {
            c.fstype = Some(fstype);
        }
        self
    }

    /// The same backend with `class` shared (volume mode `mode`), and this node joined to it.
    pub fn with_shared(mut self, class: &str, mode: lvms_core::config::SharedVolumeMode) -> Self {
        for c in self.classes.iter_mut().filter(|c| c.name == class) {
            c.access = lvms_core::config::Access::Shared(lvms_core::config::SharedConfig {
                volume_mode: mode,
                ..lvms_core::config::SharedConfig::default()
            });
        }
        self
    }

    /// The same backend with `class` adopting `adopt`'s volume group.
    pub fn with_adopt(mut self, class: &str, adopt: lvms_core::config::Adopt) -> Self {
        for c in self.classes.iter_mut().filter(|c| c.name == class) {
            c.adopt = Some(adopt);
        }
        self
    }

    /// Puts a volume another driver made on this node: invisible until taken over.
    pub fn add_foreign(&self, volume: Volume) {
        self.state
            .lock()
            .unwrap()
            .foreign
            .insert(volume.id.clone(), volume);
    }

    pub fn calls(&self) -> Vec<String> {
        self.state.lock().unwrap().calls.clone()
    }

    fn thin(&self, class: &str) -> bool {
        self.classes
            .iter()
            .any(|c| c.name == class && c.thin_pool().is_some())
    }

    /// Whether `id` is a volume of a shared class.
    fn shared_volume(&self, id: &str) -> bool {
        let class = self
            .state
            .lock()
            .unwrap()
            .volumes
            .get(id)
            .map(|v| v.class.clone());
        class.is_some_and(|class| {
            self.classes
                .iter()
                .any(|c| c.name == class && c.shared().is_some())
        })
    }

    fn round(size: u64) -> u64 {
        size.div_ceil(EXTENT) * EXTENT
    }

    fn volume(name: &str, id: String, class: &str, size: u64, thin: bool) -> Volume {
        Volume {
            id: id.clone(),
            class: class.to_owned(),
            size,
            name: Some(name.to_owned()),
            source: None,
            snapshot: false,
            thin,
            created: Some(1_700_000_000),
            requested: None,
            health: LvHealth::Ok,
            device: format!("/dev/{class}/{id}"),
            ephemeral: None,
            open: false,
        }
    }

    fn used_virtual(state: &State, class: &str) -> u64 {
        state
            .volumes
            .values()
            .filter(|v| v.class == class)
            .map(|v| v.size)
            .sum()
    }
}

impl Backend for FakeBackend {
    fn node_id(&self) -> &str {
        NODE
    }

    fn classes(&self) -> Vec<DeviceClassConfig> {
        self.classes.clone()
    }

    fn unserved(&self) -> Vec<(DeviceClassConfig, String)> {
        self.unserved.clone()
    }

    async fn ready(&self) -> Result<bool> {
        Ok(true)
    }

    async fn get(&self, id: &str) -> Result<Option<Volume>> {
        let s = self.state.lock().unwrap();
        Ok(s.volumes.get(id).cloned())
    }

    async fn list(&self) -> Result<Vec<Volume>> {
        let s = self.state.lock().unwrap();
        Ok(s.volumes.values().cloned().collect())
    }

    async fn create_volume(&self, req: &NewVolume) -> Result<Volume> {
        let delay = {
            let mut s = self.state.lock().unwrap();
            s.calls.push(format!("create_volume {}", req.name));
            s.creating += 1;
            s.most_creating = s.most_creating.max(s.creating);
            s.create_delay
        };
        tokio::time::sleep(delay).await;
        let mut s = self.state.lock().unwrap();
        s.creating -= 1;
        let id = ids::volume_lv_name(&req.name);
        let size = Self::round(req.size);
        if let Some(v) = s.volumes.get_mut(&id) {
            // As LocalBackend: a restore interrupted before its extend is finished.
            if v.requested == Some(req.size) && v.size < size {
                v.size = size;
            }
            return Ok(v.clone());
        }
        let thin = self.thin(&req.class);
        let layout = req.lv_type.unwrap_or(lvms_engine::backend::Layout::Linear);
        let mut taken = size;
        if !thin {
            let space = Self::free_of(&s, &req.class).unwrap();
            if layout.max_size(&space) < size {
                return Err(BackendError::InsufficientSpace(format!(
                    "volume group {} has {} bytes free on {} devices; a {} volume of {size} bytes does not fit",
                    req.class,
                    s.thick_free[&req.class],
                    space.devices(),
                    layout.name()
                )));
            }
            // Every image holds its share of the data (no metadata extents here).
            if let Some((images, data_stripes)) = layout.images(space.devices()) {
                taken = size / data_stripes * images;
            }
            *s.thick_free.get_mut(&req.class).unwrap() -= taken;
        }
        s.layouts.insert(id.clone(), layout);
        let mut v = Self::volume(&req.name, id.clone(), &req.class, size, thin);
        v.source = req.source.clone();
        v.requested = req.source.as_ref().map(|_| req.size);
        v.ephemeral = req.ephemeral.clone();
        s.volumes.insert(id, v.clone());
        Ok(v)
    }

    async fn create_snapshot(&self, req: &NewSnapshot) -> Result<Volume> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("create_snapshot {}", req.name));
        let id = ids::snapshot_lv_name(&req.name);
        if let Some(v) = s.volumes.get(&id) {
            return Ok(v.clone());
        }
        let src = s
            .volumes
            .get(&req.source_volume)
            .cloned()
            .ok_or_else(|| BackendError::NotFound(req.source_volume.clone()))?;
        let mut v = Self::volume(&req.name, id.clone(), &src.class, src.size, true);
        v.snapshot = true;
        v.source = Some(Source::Volume(src.id));
        s.volumes.insert(id, v.clone());
        Ok(v)
    }

    /// Its volumes stand for LVs already taken over: one it holds is returned, any other is
    /// missing.
    async fn take_over(&self, req: &lvms_engine::backend::TakeOver) -> Result<Volume> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("take_over {}", req.id));
        if let Some(v) = s.volumes.get(&req.id) {
            return Ok(v.clone());
        }
        if lvms_engine::ids::is_csi_driver_lvm_id(&req.id)
            && !self.classes.iter().any(|c| {
                c.name == req.class && c.adopt == Some(lvms_core::config::Adopt::CsiDriverLvm)
            })
        {
            return Err(BackendError::Conflict(format!(
                "class {} does not adopt csi-driver-lvm",
                req.class
            )));
        }
        match s.foreign.remove(&req.id) {
            Some(v) if v.class == req.class => {
                let v = Volume {
                    name: Some(req.name.clone()),
                    ..v
                };
                s.volumes.insert(v.id.clone(), v.clone());
                Ok(v)
            }
            other => {
                if let Some(v) = other {
                    s.foreign.insert(v.id.clone(), v);
                }
                Err(BackendError::NotFound(format!(
                    "no LV {} in class {}",
                    req.id, req.class
                )))
            }
        }
    }

    async fn delete(&self, id: &str) -> Result<bool> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("delete {id}"));
        let Some(v) = s.volumes.remove(id) else {
            return Ok(false);
        };
        let devices = s.thick_devices.get(&v.class).copied().unwrap_or(1);
        let taken = match s.layouts.remove(id).and_then(|l| l.images(devices)) {
            Some((images, data_stripes)) => v.size / data_stripes * images,
            None => v.size,
        };
        if let Some(free) = s.thick_free.get_mut(&v.class) {
            *free += taken;
        }
        Ok(true)
    }

    async fn expand(&self, id: &str, size: u64) -> Result<u64> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("expand {id} {size}"));
        let size = Self::round(size);
        let v = s
            .volumes
            .get(id)
            .cloned()
            .ok_or_else(|| BackendError::NotFound(id.to_owned()))?;
        if let Some(free) = s.thick_free.get_mut(&v.class) {
            *free -= size - v.size;
        }
        let v = s.volumes.get_mut(id).unwrap();
        v.size = v.size.max(size);
        Ok(v.size)
    }

    async fn joined_shared(&self) -> Vec<String> {
        self.classes
            .iter()
            .filter(|c| c.shared().is_some())
            .map(|c| c.name.clone())
            .collect()
    }

    async fn usage(&self, class: &str) -> Result<Option<lvms_engine::backend::Usage>> {
        Ok(self.state.lock().unwrap().usage.get(class).copied())
    }

    /// A thick class's volume group is `thick_devices` devices (one unless set) sharing
    /// `thick_free` bytes evenly.
    async fn capacity(
        &self,
        class: &str,
        layout: &lvms_engine::backend::Layout,
    ) -> Result<Capacity> {
        let s = self.state.lock().unwrap();
        let (available, devices) = if let Some(pool) = s.pool_size.get(class) {
            (
                (2 * pool).saturating_sub(Self::used_virtual(&s, class)),
                None,
            )
        } else {
            let space =
                Self::free_of(&s, class).ok_or_else(|| BackendError::NotFound(class.to_owned()))?;
            (layout.max_size(&space), Some(space.devices()))
        };
        Ok(Capacity {
            available,
            maximum_volume_size: available,
            minimum_volume_size: EXTENT,
            devices,
        })
    }

    async fn free_space(&self, class: &str) -> Result<Option<FreeSpace>> {
        let s = self.state.lock().unwrap();
        Ok(Self::free_of(&s, class))
    }

    async fn activate(&self, id: &str) -> Result<String> {
        let s = self.state.lock().unwrap();
        s.volumes
            .get(id)
            .map(|v| v.device.clone())
            .ok_or_else(|| BackendError::NotFound(id.to_owned()))
    }

    /// As the trait's default for local classes; a shared class's volume is activated for one node
    /// or several, and the call recorded.
    async fn activate_for(&self, id: &str, multi_node: bool) -> Result<String> {
        if !self.shared_volume(id) {
            if multi_node {
                return Err(BackendError::InvalidArgument(format!(
                    "volume {id} lives on one node: MULTI_NODE_* access needs a block volume of a \
                     shared device class"
                )));
            }
            return self.activate(id).await;
        }
        self.state
            .lock()
            .unwrap()
            .calls
            .push(format!("activate_for {id} multi_node={multi_node}"));
        self.activate(id).await
    }

    /// Recorded for a shared class's volume (deactivated there); nothing for local ones.
    async fn release(&self, id: &str) -> Result<()> {
        if self.shared_volume(id) {
            self.state
                .lock()
                .unwrap()
                .calls
                .push(format!("release {id}"));
        }
        Ok(())
    }
}

pub use lvms_csi::server::NoNode;
