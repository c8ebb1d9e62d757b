"""A task's exception comes back with its own type, on a real local pool (the `skyforge` binary
from $SKYFORGE_BIN), through Pool.submit and through joblib's Parallel: one whose __init__ takes
other arguments than its args, or keyword-only ones, one whose class exists only in the task
(cloudpickled by value), with its attributes, args, message, __cause__/__context__ chain and the
node's traceback; and what cannot be kept — an attribute that does not pickle or whose class
only the node has, an exception whose class only the node has — said in a note."""
import functools
import os
import sys
import threading

import pytest

joblib = pytest.importorskip("joblib")
from joblib import Parallel, delayed  # noqa: E402

import skyforge  # noqa: E402
from skyforge._payloads import dumps  # noqa: E402


class DataQualityError(Exception):
    def __init__(self, msg, row):
        super().__init__(msg)
        self.row = row


class Refused(Exception):
    """Keyword-only arguments, and an attribute that does not pickle."""

    def __init__(self, *, code):
        super().__init__(f"refused with code {code}")
        self.code = code
        self.lock = threading.Lock()


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    skyforge_bin = os.environ.get("SKYFORGE_BIN", "")
    if not os.access(skyforge_bin, os.X_OK):
        pytest.skip("$SKYFORGE_BIN does not name a built program (CTest sets it: ctest -R python)")
    tmp = tmp_path_factory.mktemp("pool")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(tmp))
        with skyforge.joblib_pool(nodes=1, concurrency=2) as p:
            yield p
    left = [f for f in os.listdir(tmp) if f.startswith("skyforge-")]
    assert not left, f"the pool left {left} behind"


def submitted(pool, fn, *args, **kwargs):
    """The exception fn(*args, **kwargs) raised on the pool, as Pool.submit's future gives it."""
    exc = pool.submit(dumps(functools.partial(fn, *args, **kwargs))).exception(timeout=60)
    assert exc is not None, "the task did not fail"
    return exc


def check_bad_row(row):
    if row == 3:
        raise DataQualityError(f"row {row} has no label", row=row)
    return row


def refuse(code):
    raise Refused(code=code)


def test_an_exception_with_its_own_init_arguments_keeps_its_type_and_attributes(pool):
    exc = submitted(pool, check_bad_row, 3)
    with pytest.raises(DataQualityError) as info:
        raise exc
    assert info.value.row == 3 and info.value.args == ("row 3 has no label",) and str(info.value) == "row 3 has no label"
    assert "raise DataQualityError" in info.value.__cause__.text  # the node's traceback
    assert "(raised on skyforge node 0 slot" in "".join(getattr(exc, "__notes__", [info.value.__cause__.text]))


def test_joblib_parallel_raises_it_for_except_to_catch(pool):
    try:
        Parallel(n_jobs=-1, batch_size=1)(delayed(check_bad_row)(i) for i in range(8))
    except DataQualityError as e:
        assert e.row == 3
    else:
        pytest.fail("no DataQualityError")
    assert Parallel(n_jobs=-1)(delayed(check_bad_row)(i) for i in range(3)) == [0, 1, 2]  # the pool goes on


def test_a_keyword_only_init_keeps_its_type_and_an_attribute_that_does_not_pickle_is_named(pool):
    exc = submitted(pool, refuse, 7)
    assert type(exc) is Refused and exc.code == 7 and str(exc) == "refused with code 7"
    assert not hasattr(exc, "lock")
    if sys.version_info >= (3, 11):
        assert any(".lock (TypeError: cannot pickle" in n for n in exc.__notes__), exc.__notes__


def test_a_class_defined_in_the_task_comes_back_as_that_class(pool):
    class LocalError(ValueError):  # cloudpickled by value with the task: no module has it
        def __init__(self, what, *, where):
            super().__init__(f"{what} at {where}")
            self.where = where

    def fail():
        raise LocalError("no", where=(2, 5))

    exc = submitted(pool, fail)
    assert type(exc) is LocalError and exc.where == (2, 5) and str(exc) == "no at (2, 5)"

    def made_on_the_node():
        class NodeError(Exception):  # made by the task: the caller never had it
            def __init__(self, n):
                super().__init__(f"n = {n}")
                self.n = n
        raise NodeError(4)

    exc = submitted(pool, made_on_the_node)
    assert type(exc).__name__ == "NodeError" and exc.n == 4 and isinstance(exc, Exception)


def chained(implicit):
    try:
        {}["key"]
    except KeyError as e:
        if implicit:
            raise DataQualityError("while looking it up", row=1)
        raise DataQualityError("no key", row=2) from e


def test_the_cause_and_context_chain_comes_back_with_the_traceback_at_its_end(pool):
    exc = submitted(pool, chained, False)
    assert isinstance(exc, DataQualityError) and exc.row == 2
    assert type(exc.__cause__) is KeyError and exc.__cause__.args == ("key",)
    assert isinstance(exc.__cause__.__cause__, skyforge.RemoteTraceback)
    assert "KeyError: 'key'" in exc.__cause__.__cause__.text and "raise DataQualityError" in exc.__cause__.__cause__.text

    exc = submitted(pool, chained, True)
    assert exc.row == 1 and exc.__cause__ is None and not exc.__suppress_context__
    assert type(exc.__context__) is KeyError
    assert isinstance(exc.__context__.__cause__, skyforge.RemoteTraceback)


NODE_ONLY = """
class NodeOnlyError(Exception):
    def __init__(self, msg, code):
        super().__init__(msg)
        self.code = code

class Detail:
    pass
"""


def node_only(where, raise_it):
    """Raises NodeOnlyError (a class only the node can import), or a DataQualityError whose .row
    is a Detail (the same)."""
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, "only_on_the_node_errors.py"), "w") as f:
        f.write(NODE_ONLY)
    sys.path.insert(0, where)
    import only_on_the_node_errors as m
    if raise_it:
        raise m.NodeOnlyError("from the node", 5)
    raise DataQualityError("odd row", row=m.Detail())


def test_what_the_caller_lacks_is_named(pool, tmp_path):
    exc = submitted(pool, node_only, str(tmp_path / "node-only"), True)
    assert type(exc) is RuntimeError and str(exc) == "NodeOnlyError: from the node"
    assert "raise m.NodeOnlyError" in exc.__cause__.text
    if sys.version_info >= (3, 11):
        assert any("could not be rebuilt here" in n and "only_on_the_node_errors" in n for n in exc.__notes__)

    exc = submitted(pool, node_only, str(tmp_path / "node-only"), False)
    assert type(exc) is DataQualityError and str(exc) == "odd row" and not hasattr(exc, "row")
    if sys.version_info >= (3, 11):
        assert any(".row (ModuleNotFoundError" in n for n in exc.__notes__), exc.__notes__
