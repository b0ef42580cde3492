"""`dtrain doctor`'s efa check with --image: a GPU image without the EFA stage (the variants
built from PyPI's CUDA wheels, label dtrain.efa=no) on an EFA instance type is a WARN naming the
family's EFA variant (issue 50). Pure: labels and facts in, a verdict out."""

from __future__ import annotations

from dtrain.images.spec import efa_variant, load_all
from dtrain.images.render import context
from dtrain.launch.troubleshoot.doctor import efa_image_verdict, efa_verdict


def labels_of(family: str, wheels: bool) -> dict[str, str]:
    img = next(i for i in load_all([family]) if i.gpu and i.wheels == wheels)
    return context(img)["labels"]


def verdict(labels: dict[str, str], itype: str, devices: int):
    return efa_image_verdict(efa_verdict(itype, devices), labels, itype, devices)


def test_wheel_image_on_p4d_warns_and_names_the_efa_variant():
    status, detail = verdict(labels_of("pytorch-ddp", wheels=True), "p4d.24xlarge", 4)
    assert status == "WARN"
    assert "p4d.24xlarge has EFA, but the image has no EFA stage (dtrain.efa=no; CUDA from wheels)" in detail
    assert "use dtrain/pytorch-ddp:2.11.0-cu128-cudnn9-py310-ubuntu22.04" in detail
    assert efa_variant("pytorch-ddp", "p4d.24xlarge") == "dtrain/pytorch-ddp:2.11.0-cu128-cudnn9-py310-ubuntu22.04"


def test_each_family_has_an_efa_variant_for_p5():
    for family in ("pytorch-ddp", "horovod-pytorch", "ray-train"):  # horovod-tensorflow: no wheel variant
        status, detail = verdict(labels_of(family, wheels=True), "p5.48xlarge", 32)
        assert status == "WARN" and f"use dtrain/{family}:" in detail and "ubuntu22.04" in detail, detail


def test_wheel_image_where_it_belongs_passes():
    labels = labels_of("pytorch-ddp", wheels=True)
    assert verdict(labels, "g5.xlarge", 0) == ("PASS", "no EFA: not an EFA instance type (g5.xlarge)")
    assert verdict(labels, "", 0)[0] == "PASS"  # not EC2


def test_efa_image_on_p4d_passes_and_a_fail_stays_a_fail():
    assert verdict(labels_of("pytorch-ddp", wheels=False), "p4d.24xlarge", 4)[0] == "PASS"
    # No EFA device attached: the node's own FAIL wins over the image's WARN.
    assert verdict(labels_of("pytorch-ddp", wheels=True), "p4d.24xlarge", 0)[0] == "FAIL"


def test_cpu_image_and_no_image_are_left_alone():
    cpu = next(i for i in load_all(["pytorch-ddp"]) if not i.gpu)
    assert context(cpu)["labels"]["dtrain.efa"] == "no"
    assert verdict(context(cpu)["labels"], "p4d.24xlarge", 4)[0] == "PASS"
    assert verdict({}, "p4d.24xlarge", 4)[0] == "PASS"


def test_labels_say_the_recipe():
    assert labels_of("ray-train", wheels=True)["dtrain.cuda-from"] == "wheels"
    efa = labels_of("ray-train", wheels=False)
    assert efa["dtrain.cuda-from"] == "nvidia/cuda" and efa["dtrain.efa"] == "yes"


def test_wheel_image_on_a_single_efa_type_is_not_a_warn():
    """g5/g6/g4dn types take one EFA interface: the wheel variant is the documented choice there,
    so the node's own verdict stands (with a note), while a multi-EFA type still WARNs."""
    labels = labels_of("pytorch-ddp", wheels=True)
    for itype in ("g5.48xlarge", "g6.48xlarge", "g5.12xlarge", "g4dn.12xlarge", "p3dn.24xlarge"):
        status, detail = verdict(labels, itype, 1)
        assert status == "PASS", (itype, detail)
        assert detail.startswith("1 EFA device(s) (" + itype + " has 1)") and "no EFA stage" in detail, detail
    # A single-EFA node that lacks its interface is still the node's FAIL, not hidden by the image.
    assert verdict(labels, "g5.48xlarge", 0)[0] == "FAIL"


def test_wheel_image_warns_where_the_node_has_fewer_efa_than_the_type_expects_or_several():
    labels = labels_of("pytorch-ddp", wheels=True)
    # p4d with only one of its 4 interfaces: the node's WARN (fewer than the type's expectation).
    assert efa_verdict("p4d.24xlarge", 1)[0] == "WARN"
    status, detail = verdict(labels, "p4d.24xlarge", 1)
    assert status == "WARN" and "no EFA stage" in detail and "1 of the 4 EFA devices p4d.24xlarge has" in detail, detail
    # The EFA image there: only the node's WARN.
    status, detail = verdict(labels_of("pytorch-ddp", wheels=False), "p4d.24xlarge", 1)
    assert status == "WARN" and detail.startswith("1 of the 4 EFA devices"), detail
    # g6e.48xlarge: 4 EFA interfaces, all there: the image's WARN.
    status, detail = verdict(labels, "g6e.48xlarge", 4)
    assert status == "WARN" and "no EFA stage" in detail, detail
    # An EFA image on a single-EFA type: a plain PASS, no note.
    assert verdict(labels_of("pytorch-ddp", wheels=False), "g5.48xlarge", 1) == ("PASS", "1 EFA device(s) (g5.48xlarge has 1)")
