// One GPU node and one model through the gpu-serving component package: the arguments are the keys of a
// stack file (docs/configuration.md), checked by the same code, and refused in one line naming the key.
import * as pulumi from "@pulumi/pulumi";
import * as gpuServing from "@pulumi/gpu-serving";

const config = new pulumi.Config();

const lab = new gpuServing.GpuServing("lab", {
    cluster: {
        namespace: "ai-lab",
        kubeconfig: { path: ".kube/lab.yaml" },
        autoscaling: "none",
        requireCommitRevisions: false,
        monitoring: { labels: { release: "kube-prometheus-stack" } },
    },
    nodes: [{
        name: "lab-node",
        ssh: { host: "127.0.0.1", port: 2222, user: "root" },
        gpu: { product: "nvidia-t4", count: 1 },
        storage: {
            disks: ["/dev/disk/by-id/virtio-gs-disk-a", "/dev/disk/by-id/virtio-gs-disk-b"],
            sizeGb: 2,
            raidName: "models",
            mountpoint: "/mnt/models",
        },
        containerRuntime: "none",
    }],
    modelStorage: { type: "local", node: "lab-node" },
    models: [{
        name: "qwen25-05b",
        huggingFaceId: "Qwen/Qwen2.5-0.5B-Instruct",
        revision: "main",
        image: "vllm/vllm-openai:v0.11.0",
        gpuProduct: "nvidia-t4",
        gpusPerReplica: 1,
        maxModelLen: 4096,
        weightsGb: 1,
        cpu: "2",
        memory: "8Gi",
    }],
    // The value of each secret key the arguments name (nodes[].ssh.privateKeySecret defaults to sshPrivateKey).
    secrets: {
        sshPrivateKey: config.requireSecret("sshPrivateKey"),
        hfToken: config.requireSecret("hfToken"),
    },
});

export const models = lab.models;
export const nodes = lab.nodes;
