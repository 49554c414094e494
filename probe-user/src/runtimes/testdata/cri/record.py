"""Runs a pod with one container through a CRI runtime (as kubelet would ask for it) and
records the raw protobuf answers workerprobe asks for: Version, ListPodSandbox,
ListContainers. Usage: record.py SOCKET OUT_DIR (api_pb2*.py generated from CRI's api.proto
with grpc_tools.protoc). The images localhost/wp-pause:test (the runtime's sandbox_image) and
localhost/wp-busybox:test must be in the runtime's k8s.io namespace."""
import sys, time, grpc, api_pb2 as pb, api_pb2_grpc as rpc

sock, out = sys.argv[1], sys.argv[2]
channel = grpc.insecure_channel(f"unix://{sock}")
runtime = rpc.RuntimeServiceStub(channel)
print(runtime.Version(pb.VersionRequest(version="v1")))
config = pb.PodSandboxConfig(
    metadata=pb.PodSandboxMetadata(name="ingest-7f9c", uid="5d1c2a3b-8e4f-4a6b-9c0d-1e2f3a4b5c6d", namespace="data", attempt=0),
    log_directory="/tmp/cri/logs",
    # What kubelet puts on every sandbox it asks for.
    labels={"app": "ingest", "io.kubernetes.pod.name": "ingest-7f9c", "io.kubernetes.pod.namespace": "data",
            "io.kubernetes.pod.uid": "5d1c2a3b-8e4f-4a6b-9c0d-1e2f3a4b5c6d"},
    linux=pb.LinuxPodSandboxConfig(
        cgroup_parent="/kubepods/burstable/pod5d1c2a3b-8e4f-4a6b-9c0d-1e2f3a4b5c6d",
        security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=pb.NamespaceOption(network=pb.NODE, pid=pb.POD, ipc=pb.POD))),
)
sandbox = runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config)).pod_sandbox_id
print("sandbox", sandbox)
container = runtime.CreateContainer(pb.CreateContainerRequest(
    pod_sandbox_id=sandbox,
    config=pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="worker", attempt=0),
        image=pb.ImageSpec(image="localhost/wp-busybox:test"),
        command=["/bin/sh", "-c", "while :; do :; done"],
        log_path="worker.log",
        # What kubelet puts on every container it asks for.
        labels={"io.kubernetes.container.name": "worker", "io.kubernetes.pod.name": "ingest-7f9c",
                "io.kubernetes.pod.namespace": "data", "io.kubernetes.pod.uid": "5d1c2a3b-8e4f-4a6b-9c0d-1e2f3a4b5c6d"},
    ),
    sandbox_config=config,
)).container_id
print("container", container)
runtime.StartContainer(pb.StartContainerRequest(container_id=container))
time.sleep(1)
for name, request, call in [
    ("version", pb.VersionRequest(version="v1"), "/runtime.v1.RuntimeService/Version"),
    ("list_pod_sandbox", pb.ListPodSandboxRequest(), "/runtime.v1.RuntimeService/ListPodSandbox"),
    ("list_containers", pb.ListContainersRequest(), "/runtime.v1.RuntimeService/ListContainers"),
]:
    raw = channel.unary_unary(call, request_serializer=lambda m: m.SerializeToString(), response_deserializer=lambda b: b)(request)
    open(f"{out}/{name}.pb", "wb").write(raw)
    print(name, len(raw), "bytes")
print(runtime.ListContainers(pb.ListContainersRequest()))
print(runtime.ListPodSandbox(pb.ListPodSandboxRequest()))
