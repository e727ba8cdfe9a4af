# SPDX-License-Identifier: BSD-3-Clause
"""How lucid_amp's classes meet torch.compile."""

import inspect

import torch


def opaque_to_dynamo(cls: type) -> None:
    """Wraps each public method defined in ``cls``'s own body with
    ``torch.compiler.disable``, so that a ``torch.compile``'d function runs each call as one
    opaque call: one graph break. Traced instead, a method would break the graph at every
    call into the extension (Dynamo cannot trace pybind11 functions) and resume after it.
    The wrap is recursive (Dynamo's default): everything a method calls,
    ``optimizer.step`` included, runs eagerly too; non-recursive, Dynamo would compile the
    frames it calls, at further breaks. Outside a compiled region a wrapped call costs
    under a microsecond more. Inherited methods are wrapped where they are defined."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(member):
            setattr(cls, name, torch.compiler.disable(member))
