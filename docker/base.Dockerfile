# The offline base image's second half: the imported Debian root file system (debootstrap
# minbase, see `patchbay base-image`) plus a virtual environment holding the host's torch
# wheel. Nothing is fetched from a network here: the wheels come in the build context.
ARG ROOTFS
FROM ${ROOTFS}
ARG TORCH_SPEC
COPY wheels /tmp/wheels
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-index --no-cache-dir --disable-pip-version-check -q \
        --find-links /tmp/wheels "${TORCH_SPEC}" \
 && rm -rf /tmp/wheels \
 && /opt/venv/bin/python -c 'import torch; print("torch", torch.__version__)'
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8
