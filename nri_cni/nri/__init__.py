"""NRI: the multiplexer (mux, trunk), the Plugin service mapping and the plugin Stub."""
