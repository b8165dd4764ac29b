"""Stage 2 (per call): what runs per call and between calls, and for programs thunder cannot trace whole.

* ``cache_policy``: the per-call wrappers, composed in the order a call runs through them; ``cache``: the cache
  bound, miss reasons, ``config``;
* ``disk_cache``: compilations reused across processes; ``disk_trust``: who may have written an entry;
* ``graph_breaks``: regions at module boundaries; ``eager_calls``: a submodule called eagerly inside a region, with
  ``eager_call_state`` (what it could change, checked every call) and ``unreached_grads``;
* ``speculation``: data-dependent branches computed while tracing and guarded in the prologue.

The last folder of the pipeline: it may import every other (``tests/test_layering.py``).
"""
