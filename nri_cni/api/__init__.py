"""Protobuf messages of the NRI protocol and of ttrpc's envelope.

The *_pb2 modules are generated from proto/ by `python -m nri_cni.tools.genproto`; do not edit
them. Import the modules you need (`from nri_cni.api import nri_pb2`); this package imports
nothing itself, so the CNI shim never pays for protobuf.
"""
