"""A layer's own statements and the functions its forward calls, as steps.

What runs in a generic layer's ``forward`` outside its children and its framework's methods
would be the layer's own time, in no named step. Here it gets steps of its own:

- :mod:`.routes`: the functions a forward reads through its module's globals (found in its
  bytecode) routed through steps while a layer of that module runs;
- :mod:`.statements`: what a statement of a forward does (work of its own, a call of a step,
  neither) and what its step is called;
- :mod:`.split`: a statement that calls steps and does work of its own, split in the order
  Python evaluates it;
- :mod:`.rewrite`: the transformer that puts each statement of work in a ``with <step>:``;
- :mod:`.forward`: the forward compiled from the installed source so changed, used only
  where the unchanged source compiles to the code that runs.
"""
