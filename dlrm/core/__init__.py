"""The training core: topology -> model -> sharding -> optimizers -> trainer (checkpoints, metrics).

Data flows one way: `dlrm.config` describes the job, `topology` builds the process groups and the
planner's view of the hardware, `model` builds the network on the meta device, `sharding` plans and
distributes it, `optim` and `dense_sync` train it, and `trainer` drives it all, with `checkpoint`
and `metrics` as its components.
"""
