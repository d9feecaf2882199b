import pytest

from diffspec.ar_image.config import MCSJDConfig, SJDConfig


def test_defaults_and_registry_metadata():
    sjd, mc = SJDConfig(), MCSJDConfig()
    assert (sjd.method, sjd.family, sjd.exact, sjd.window, sjd.coupling) == ("sjd", "ar_image", True, 16, "independent")
    assert (mc.method, mc.window, mc.coupling, mc.init) == ("mc-sjd", 64, "maximal", "repeat")
    assert sjd.sampling == {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
    assert mc.to_dict()["method"] == "mc-sjd"


@pytest.mark.parametrize("field, value, message", [
    ("window", 0, r"window=0 is out of range: allowed \[1, 4096\]"),
    ("init", "zeros", r"init='zeros' is not supported: choose one of 'uniform', 'uniform-onehot', 'repeat'"),
    ("temperature", -1.0, r"temperature=-1.0 is out of range: allowed \[0.0, 100.0\]"),
    ("top_k", 1.5, r"top_k=1.5 must be an integer in \[0, inf\]"),
    ("top_p", 0.0, r"top_p=0.0 is out of range: allowed \(0.0, 1.0\]"),
])
def test_errors_name_field_value_and_range(field, value, message):
    with pytest.raises(ValueError, match=message):
        SJDConfig(**{field: value})
    with pytest.raises(ValueError, match=message):
        MCSJDConfig().replace(**{field: value})


def test_mc_coupling_choices():
    assert MCSJDConfig(coupling="gumbel").coupling == "gumbel"
    with pytest.raises(ValueError, match=r"coupling='independent' is not supported: choose one of 'maximal', 'gumbel'"):
        MCSJDConfig(coupling="independent")
    with pytest.raises(ValueError, match="SJDConfig has no field"):
        SJDConfig().replace(coupling="maximal")


def test_cuda_graphs_field_is_checked():
    assert SJDConfig(cuda_graphs=True).cuda_graphs and not MCSJDConfig().cuda_graphs
    with pytest.raises(ValueError, match="cuda_graphs='yes' must be True or False"):
        MCSJDConfig(cuda_graphs="yes")
    with pytest.raises(ValueError, match="does not support coupling='gumbel'"):
        MCSJDConfig(coupling="gumbel", cuda_graphs=True)
