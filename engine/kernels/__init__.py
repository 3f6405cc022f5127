"""A CPU's compute kernels. In C, for its hot loops that eager torch runs as many small library
calls or on one thread, compiled on first use for this CPU (`build.py`) and called with ctypes;
each beside the torch path it replaces, which stays where the kernel cannot be built. And the
matrix products: which library (oneDNN or torch's BLAS) runs each kind (`cpu_products.py`,
`product_route.py`)."""
