"""Config YAML is read with libyaml's C loader when PyYAML has it: the same values as PyYAML's
SafeLoader, and nothing but safe types."""

from __future__ import annotations

import pytest
import yaml

from services.contracts import yaml_documents

STREAM = """\
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {name: team-a}
spec:
  cohort: research
  resourceGroups:
  - coveredResources: [cpu, nvidia.com/gpu]
    flavors:
    - name: a100
      resources:
      - {name: nvidia.com/gpu, nominalQuota: 8, borrowingLimit: null}
      - {name: cpu, nominalQuota: "64", lendingLimit: 1.5}
---
---
when: 2026-11-29T09:00:00Z
flags: [yes, no, on, off, ~]
"""


def test_the_c_loader_is_used_where_pyyaml_has_it():
    assert yaml.__with_libyaml__, "PyYAML without libyaml: config reads fall back to the slow pure-Python loader"
    assert yaml_documents._Loader is yaml.CSafeLoader


def test_documents_read_as_pyyaml_safe_load_reads_them():
    assert yaml_documents.load_all(STREAM) == list(yaml.safe_load_all(STREAM))
    assert yaml_documents.load_all(STREAM.encode()) == list(yaml.safe_load_all(STREAM))
    assert yaml_documents.load("a: [1, 2]") == {"a": [1, 2]}


def test_python_object_tags_are_refused():
    with pytest.raises(yaml.YAMLError):
        yaml_documents.load_all("!!python/object/apply:os.system ['true']")


def test_a_config_directory_is_its_yaml_files_in_name_order_without_subdirectories(tmp_path):
    (tmp_path / "b.yml").write_text("kind: B\n")
    (tmp_path / "a.yaml").write_text("kind: A1\n---\nkind: A2\n")
    (tmp_path / "notes.txt").write_text("kind: ignored\n")
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "c.yaml").write_text("kind: ignored\n")
    assert yaml_documents.documents_in(tmp_path) == [
        (str(tmp_path / "a.yaml"), {"kind": "A1"}),
        (str(tmp_path / "a.yaml"), {"kind": "A2"}),
        (str(tmp_path / "b.yml"), {"kind": "B"}),
    ]
