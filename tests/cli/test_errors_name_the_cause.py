"""Errors a new user hits name the real cause in one sentence (issue 29): eager PyTorch itself
failing on the inputs is not strata's internal error, and a misspelled tensor method names a
tensor, not strata's FakeTensor."""
from strata.cli import main


def _one_sentence(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_eager_failing_on_the_inputs_is_said_so(capsys):
    err = _one_sentence(capsys, ["run", "-c", "torch.randint(0, 5, (4,)) // torch.randint(0, 1, (4,))",
                                 "--device", "sim"])
    assert "eager PyTorch fails on these inputs" in err and "ZeroDivisionError" in err
    assert "internal error" not in err


def test_misspelled_tensor_method_names_a_tensor(capsys):
    err = _one_sentence(capsys, ["compile", "-c", "torch.randn(4).softmaxx(0)", "--ir", "torch"])
    assert "a tensor has no attribute 'softmaxx'" in err and "FakeTensor" not in err
