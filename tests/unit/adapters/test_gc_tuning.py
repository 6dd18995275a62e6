import gc

import pytest

from services.adapters.gc_tuning import SERVICE_THRESHOLDS, thresholds_from_env, tune_gc


def test_services_default_to_rarer_young_collections():
    assert thresholds_from_env({}) == SERVICE_THRESHOLDS
    assert SERVICE_THRESHOLDS[0] > 700  # CPython's gen0 default


def test_env_override_restores_cpython_defaults():
    before = gc.get_threshold()
    try:
        assert tune_gc({"QM_GC_THRESHOLD": "700, 10, 10"}) == (700, 10, 10)
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)


@pytest.mark.parametrize("raw", ["50000", "a,b,c", "1,2,-3", "1,2,3,4"])
def test_bad_override_names_the_variable_and_the_expected_form(raw):
    with pytest.raises(ValueError, match=r"QM_GC_THRESHOLD=.*three non-negative integers like '50000,10,10'"):
        thresholds_from_env({"QM_GC_THRESHOLD": raw})


def test_start_up_objects_leave_the_collectors_scans():
    import gc

    from services.adapters.gc_tuning import freeze_startup_objects

    try:
        frozen = freeze_startup_objects()
        assert frozen == gc.get_freeze_count() > 1000  # at least the imported modules' objects
    finally:
        gc.unfreeze()
