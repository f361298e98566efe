"""Images from their bytes: the CPU path's JPEG and PNG decoders, the pixel budget."""
