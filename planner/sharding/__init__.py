"""Sharding inside a layer: logical meshes and tensor layouts, each operator's strategies
and their costs, the weights' synchronisation, the layer graph an assignment of strategies
is priced on, and the uniform (Megatron-style) assignment."""
