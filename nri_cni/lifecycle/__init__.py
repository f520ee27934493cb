"""Network-level verbs INIT and DEINIT, per network generation (docs/lifecycle.md)."""

from nri_cni.lifecycle.generation import cache_counter
from nri_cni.lifecycle.manager import NetworkLifecycle
from nri_cni.lifecycle.records import GenerationRecord, RecordStore
from nri_cni.lifecycle.spec import DEINIT, INIT, LIFECYCLE_KEY, generation_id, is_managed
from nri_cni.lifecycle.verbs import VerbRunner

__all__ = [
    "DEINIT",
    "INIT",
    "LIFECYCLE_KEY",
    "GenerationRecord",
    "NetworkLifecycle",
    "RecordStore",
    "VerbRunner",
    "cache_counter",
    "generation_id",
    "is_managed",
]
