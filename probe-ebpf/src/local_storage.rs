//! Local storage maps (a value per task, per socket) in the BTF map layout. aya-ebpf 0.2 has
//! a type only for socket storage read from a sock_addr program's context; the loader passes
//! these definitions through with `allow_unsupported_maps`.

use core::ffi::c_void;

use aya_ebpf::helpers::generated::bpf_task_storage_get;

/// `BPF_MAP_TYPE_SK_STORAGE`.
pub const SK_STORAGE: usize = 24;
/// `BPF_MAP_TYPE_TASK_STORAGE`.
pub const TASK_STORAGE: usize = 29;

/// A local storage map of `MAP_TYPE` holding a `V` per owner.
#[repr(C)]
pub struct LocalStorage<V, const MAP_TYPE: usize> {
    r#type: *const [i32; MAP_TYPE],
    key: *const i32,
    value: *const V,
    max_entries: *const [i32; 0],
    /// BPF_F_NO_PREALLOC, required for local storage.
    map_flags: *const [i32; 1],
}

// SAFETY: placeholder pointers the loader reads as BTF, never dereferenced.
unsafe impl<V, const MAP_TYPE: usize> Sync for LocalStorage<V, MAP_TYPE> {}

impl<V, const MAP_TYPE: usize> LocalStorage<V, MAP_TYPE> {
    /// The definition; the kernel makes the map from its BTF.
    pub const fn new() -> Self {
        Self {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    /// The map, as the storage helpers take it.
    #[inline(always)]
    pub fn as_ptr(&self) -> *mut c_void {
        self as *const Self as *mut c_void
    }
}

/// `BPF_LOCAL_STORAGE_GET_F_CREATE`.
const F_CREATE: u64 = 1;

impl<V> LocalStorage<V, TASK_STORAGE> {
    /// The task's value; with `create`, made (zeroed) if it has none. `None` when it has none
    /// (or the kernel could not allocate, or the storage was busy on this CPU).
    #[inline(always)]
    pub fn task_value(&self, task: *const u8, create: bool) -> Option<&'static mut V> {
        // SAFETY: the map pointer is this task storage; `task` is a BTF task pointer.
        let value = unsafe {
            bpf_task_storage_get(
                self.as_ptr(),
                task as *mut _,
                core::ptr::null_mut(),
                if create { F_CREATE } else { 0 },
            )
        };
        // SAFETY: the kernel returns a pointer to this task's value or null.
        unsafe { (value as *mut V).as_mut() }
    }
}
